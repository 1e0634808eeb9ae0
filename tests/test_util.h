/* test_util.h — helpers shared by the C tests: where test data lives. */
#ifndef MK_TEST_UTIL_H
#define MK_TEST_UTIL_H

#include <stdlib.h>

/* Criterion per-test timeouts in seconds, scaled under AddressSanitizer (`make asan`), whose
 * instrumented build runs the model 3-5x slower: a timeout is a hang detector, not a speed test. */
#if defined(__SANITIZE_ADDRESS__)
#define MK_TEST_TIMEOUT(s) ((s) * 6.0)
#else
#define MK_TEST_TIMEOUT(s) ((s) * 1.0)
#endif

/* tests/data, relative to the repository root (tests run from there); MINKE_TEST_DATA overrides. */
static inline const char *mk_test_data_dir(void) {
    const char *d = getenv("MINKE_TEST_DATA");
    return d ? d : "tests/data";
}

#endif
