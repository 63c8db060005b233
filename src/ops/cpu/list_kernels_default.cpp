// The CPU list kernels' element loops for baseline x86-64 (any CPU).
#define AMP_CPU_RANGE_FN process_range_default
#include "ops/cpu/list_kernels_impl.h"
