// The low-precision optimizer loops for the baseline x86-64 (or whatever the target architecture is); always available.
#define AMP_LP_ADAM_RANGE adam_range_default
#define AMP_LP_SGD_RANGE sgd_range_default
#include "optim/cpu/low_precision_ranges_impl.h"
