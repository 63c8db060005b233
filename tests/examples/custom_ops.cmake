# custom_ops's runs (included by CMakeLists.txt): every dtype check on the CPU, a bad option, and a
# standalone build.
set(_custom_ops_dtypes "autocast to BFloat16 on cpu:\n.*  ok     at::linear inside autocast returns: BFloat16\n.*  ok     FusedLinearGelu inside autocast: forward computes in: Float, Float, Float, autocast off\n.*  ok     amp_example::scaled_mm \\(lower_precision\\) inside autocast: kernel receives: BFloat16, BFloat16\n.*autocast to Half on cpu:\n.*  ok     amp_example::row_logsumexp \\(fp32\\) inside autocast: kernel receives: Float\n.*all 36 dtype checks passed\n")
amp_example_run(custom_ops sees_the_promised_dtypes EXIT 0
  OUTPUT "${_custom_ops_dtypes}" ARGS --device cpu)
amp_example_run(custom_ops rejects_an_unknown_device EXIT 2
  OUTPUT "custom_ops: error: --device must be one of cpu, cuda, not 'tpu'" ARGS --device tpu)

if(DEFINED _amp_prefix)
  amp_example_standalone(custom_ops PASS "all 36 dtype checks passed" COMMAND custom_ops)
endif()
