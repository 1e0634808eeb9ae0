/* test_util.h — helpers shared by the C tests: where test data lives. */
#ifndef MK_TEST_UTIL_H
#define MK_TEST_UTIL_H

#include <stdlib.h>

/* tests/data, relative to the repository root (tests run from there); MINKE_TEST_DATA overrides. */
static inline const char *mk_test_data_dir(void) {
    const char *d = getenv("MINKE_TEST_DATA");
    return d ? d : "tests/data";
}

#endif
