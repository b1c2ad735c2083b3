/*
 * log.h - rank-aware logging to stderr.
 *
 * Lines look like "hp-train: message" from rank 0 and
 * "hp-train: rank 3 on HOST: message" from any other rank.  Info lines are
 * printed by rank 0 only (unless HP_LOG=all); warnings and errors by every
 * rank.  HP_LOG=debug enables debug lines.  Nothing here writes to stdout.
 */
#ifndef HP_LOG_H
#define HP_LOG_H

/* Set the tool name and this process's rank (call again after MPI_Init). */
void hp_log_init(const char *tool, int rank);
const char *hp_log_tool(void);
int hp_log_rank(void);

void hp_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hp_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hp_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void hp_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
