/* Which of the library's builds this CPU runs (beamserve.h): compiled once, for the baseline. */
#include <stdint.h>

#if defined(BEAMSERVE_X86_LEVELS)
int beamserve_cpu_level_v1(void);
#endif

/* The best level built into the library that this CPU runs, at most `most` (BEAMSERVE_NATIVE_KERNELS asks for
 * a lower one, to measure what a CPU of that level computes): 4, 3 or 1. */
int beamserve_level(int most) {
#if defined(BEAMSERVE_X86_LEVELS)
    int level = beamserve_cpu_level_v1();
    if (most < level) level = most;
    return level >= 4 ? 4 : level >= 3 ? 3 : 1;
#else
    (void)most;
    return 1;
#endif
}
