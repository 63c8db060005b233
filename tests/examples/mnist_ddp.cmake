# mnist_ddp's runs (included by CMakeLists.txt when amp::distributed is built): the fixture
# trained by 2 and 3 processes under torchrun on Gloo, in each transfer dtype, against the
# one-process run.
get_filename_component(_amp_venv_bin "${AMP_PYTHON}" DIRECTORY)
function(amp_example_ddp name ranks epochs)
  cmake_parse_arguments(PARSE_ARGV 3 _ddp "" "BUCKETS" "")
  list(JOIN _ddp_UNPARSED_ARGUMENTS "|" _args)
  set(_buckets "")
  if(DEFINED _ddp_BUCKETS)
    set(_buckets "-DBUCKETS=${_ddp_BUCKETS}")
  endif()
  add_test(NAME example.mnist_ddp.${name}
    COMMAND "${CMAKE_COMMAND}" "-DTORCHRUN=${_amp_venv_bin}/torchrun"
      "-DPROGRAM=$<TARGET_FILE:mnist_ddp>" "-DRANKS=${ranks}" "-DEPOCHS=${epochs}"
      "-DARGS=${_args}" ${_buckets} -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/check_ddp.cmake")
  set_tests_properties(example.mnist_ddp.${name} PROPERTIES
    FIXTURES_REQUIRED example_idx_fixture LABELS "example;distributed" PROCESSORS ${ranks}
    TIMEOUT 300)
endfunction()

amp_example_ddp(two_ranks_fp16_under_torchrun 2 4
  --data "${_fixture}/good" --epochs 4 --precision fp16)
amp_example_ddp(two_ranks_fp16_gradients_in_fp16 2 4
  --data "${_fixture}/good" --epochs 4 --precision fp16 --comm-dtype fp16)
# 63 images per step divide among 3 ranks; the shards are padded as DistributedSampler pads.
amp_example_ddp(three_ranks_bf16_gradients_in_bf16 3 4
  --data "${_fixture}/good" --epochs 4 --precision bf16 --comm-dtype bf16 --batch-size 63)
# An MLP of three 64-wide hidden layers and buckets of 16 KiB: three buckets (the output and last
# hidden layer, the middle one, the first) all-reduced during each backward.
amp_example_ddp(two_ranks_mlp_several_buckets 2 4 BUCKETS 3
  --data "${_fixture}/good" --epochs 4 --precision fp16 --hidden 64 --layers 3 --lr 0.2
  --batch-size 16 --bucket-mb 0.015625)
# Two nodes as users start them: two torchrun agents (--nnodes 2 --node-rank 0|1, c10d
# rendezvous on 127.0.0.1), one process each, must train bit-identical parameters.
add_test(NAME example.mnist_ddp.two_nodes_c10d_rendezvous
  COMMAND "${AMP_PYTHON}" "${CMAKE_CURRENT_LIST_DIR}/check_ddp_multinode.py"
    "${_amp_venv_bin}/torchrun" "$<TARGET_FILE:mnist_ddp>"
    --data "${_fixture}/good" --epochs 2 --precision fp16 --comm-dtype bf16)
set_tests_properties(example.mnist_ddp.two_nodes_c10d_rendezvous PROPERTIES
  FIXTURES_REQUIRED example_idx_fixture LABELS "example;distributed" PROCESSORS 2 TIMEOUT 300)
