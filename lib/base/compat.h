/*
 * compat.h - force-included first into every C file of lib/, kernels/cpu/,
 * tools/ and t/ (the Makefile passes -include lib/base/compat.h).  It pulls in the
 * system headers that declare the banned functions, so that banned.h can
 * poison them without breaking those declarations.
 */
#ifndef HP_COMPAT_H
#define HP_COMPAT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <wchar.h>

#include "base/banned.h"

#endif
