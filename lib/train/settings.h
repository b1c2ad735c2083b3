/*
 * settings.h - the settings hp-train refuses, in one place: a key it
 * parses but cannot honor is refused by name with a one-line error, never
 * accepted and ignored.  The config layer refuses what no tool can honor
 * (lib/config/config.c), the plan what no layout can (lib/plan/plan.c);
 * these are what a training run needs besides.
 */
#ifndef HP_TRAIN_SETTINGS_H
#define HP_TRAIN_SETTINGS_H

#include "backend/backend.h"
#include "base/err.h"
#include "config/config.h"
#include "plan/plan.h"

/* What the config alone decides: data, batch sizes, the keys hp-train
 * does not implement.  HP_ECONFIG or HP_EUNSUP naming the key. */
int hp_train_check_config(const struct hp_config *c, struct hp_err *e);
/* What the device and the layout decide: mix_precision, torch_dtype on the
 * CPU, rank_average over ranks. */
int hp_train_check_layout(const struct hp_config *c, const struct hp_plan *p, const struct hp_backend *bk,
			  struct hp_err *e);

#endif
