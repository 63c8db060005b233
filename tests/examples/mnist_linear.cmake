# mnist_linear's runs (included by CMakeLists.txt): training in each precision on the fixture,
# skipped fp16 steps, exact resume, the same with FusedSGD, metrics and --compare, each kind of bad
# input, and a standalone build.

# The seed's hyper-parameters: 4 epochs of 4 steps take the fixture from chance to over 90%.
# The dtypes line proves autocast was on (bf16, fp16) or off (fp32) during the forward pass; only
# fp16 scales the loss, and its epoch lines report the scale and the skipped steps.
set(_logits_fp32 Float)
set(_logits_bf16 BFloat16)
set(_logits_fp16 Half)
set(_scaler_fp32 OFF)
set(_scaler_bf16 OFF)
set(_scaler_fp16 ON)
foreach(_precision IN ITEMS fp32 bf16 fp16)
  amp_example_run(mnist_linear learns_the_fixture_in_${_precision} EXIT 0 EPOCHS 4 MIN_ACCURACY 90
    SCALER ${_scaler_${_precision}}
    OUTPUT "precision ${_precision} .*forward pass: logits ${_logits_${_precision}}, loss Float"
    ARGS --data "${_fixture}/good" --epochs 4 --precision ${_precision})
endforeach()
# An initial scale of 2^20 overflows float16 weight gradients on the fixture: the scaler skips the
# first two steps, backing off to 2^18, where they fit, and the fp16 run still learns the fixture.
# The seed's Linear(784, 10) in float8 (amp::fp8, emulated on the CPU), tensorwise and delayed.
foreach(_recipe IN ITEMS tensorwise delayed)
  amp_example_run(mnist_linear learns_the_fixture_in_fp8_${_recipe} EXIT 0 EPOCHS 4 MIN_ACCURACY 90
    OUTPUT "precision fp8 .*forward pass: logits BFloat16, loss Float"
    ARGS --data "${_fixture}/good" --epochs 4 --precision fp8 --fp8-recipe ${_recipe})
endforeach()
amp_example_run(mnist_linear skips_overflowing_fp16_steps_and_backs_off EXIT 0 EPOCHS 4 MIN_ACCURACY 90
  SCALER ON
  OUTPUT "epoch 1/4: [^\n]*, loss scale 262144, skipped steps 2 of 4, .*epoch 4/4: [^\n]*, loss scale 262144, skipped steps 0 of 4, "
  ARGS --data "${_fixture}/good" --epochs 4 --precision fp16 --init-scale 1048576)
# FusedSGD takes the scale and the overflow flag from the scaler and skips on the device: the
# same two steps are skipped, the scaler backs off the same way, and the run learns the fixture.
amp_example_run(mnist_linear skips_overflowing_fp16_steps_with_fused_sgd EXIT 0 EPOCHS 4
  MIN_ACCURACY 90 SCALER ON
  OUTPUT "batch size 64, FusedSGD lr 0.01, .*epoch 1/4: [^\n]*, loss scale 262144, skipped steps 2 of 4, .*epoch 4/4: [^\n]*, loss scale 262144, skipped steps 0 of 4, "
  ARGS --data "${_fixture}/good" --epochs 4 --precision fp16 --init-scale 1048576
    --optimizer fused-sgd)
# On a machine with a GPU the same fp16 run trains on it; elsewhere it is reported as skipped.
amp_example_run(mnist_linear learns_the_fixture_in_fp16_on_cuda EXIT 0 EPOCHS 4 MIN_ACCURACY 90 SCALER ON
  SKIP_IF "--device cuda needs a CUDA GPU, but none is available"
  OUTPUT "precision fp16 [^\n]*, device cuda,.*forward pass: logits Half, loss Float"
  ARGS --data "${_fixture}/good" --epochs 4 --precision fp16 --device cuda)
amp_example_run(mnist_linear learns_the_fixture_with_fused_sgd_in_fp16_on_cuda EXIT 0 EPOCHS 4
  MIN_ACCURACY 90 SCALER ON
  SKIP_IF "--device cuda needs a CUDA GPU, but none is available"
  OUTPUT "precision fp16 [^\n]*, device cuda,[^\n]*, FusedSGD lr 0.01,.*forward pass: logits Half, loss Float"
  ARGS --data "${_fixture}/good" --epochs 4 --precision fp16 --device cuda --optimizer fused-sgd)
amp_example_run(mnist_linear rejects_cuda_without_a_gpu EXIT 1
  SKIP_IF "device cuda, epochs 1"
  OUTPUT "^mnist_linear: error: --device cuda needs a CUDA GPU, but none is available \\(no GPU or driver on this machine, or a LibTorch built without CUDA\\); run on the CPU with --device cpu\n$"
  ARGS --data "${_fixture}/good" --epochs 1 --device cuda)

# fp16 with an initial scale that overflows and a growth interval of 3 steps (on the fixture the
# scale backs off, grows and backs off again; steps are skipped in epochs 1, 2, 3 and 5): at the
# checkpoint the scale, the growth tracker and the skip counters all differ from a fresh
# scaler's, so a resume that lost any of them, or the shuffle order, or the weights, would print
# other lines.
amp_example_resume(mnist_linear resumes_fp16_exactly_as_an_uninterrupted_run
  EPOCHS 5 STOP_AFTER 2 STOP_WITH epochs
  ARGS --data "${_fixture}/good" --precision fp16 --init-scale 1048576 --growth-interval 3)
amp_example_resume(mnist_linear resumes_fp16_with_fused_sgd_exactly_as_an_uninterrupted_run
  EPOCHS 5 STOP_AFTER 2 STOP_WITH epochs
  ARGS --data "${_fixture}/good" --precision fp16 --init-scale 1048576 --growth-interval 3
    --optimizer fused-sgd)
amp_example_resume(mnist_linear resumes_fp32_exactly_as_an_uninterrupted_run
  EPOCHS 4 STOP_AFTER 1 STOP_WITH epochs
  ARGS --data "${_fixture}/good" --precision fp32)
# The optimizers read each other's state, but a run continues with the one it started with.
amp_example_run(mnist_linear refuses_a_checkpoint_of_another_optimizer EXIT 1
  OUTPUT "mnist_linear: error: the checkpoint '[^']*split.pt' was written with --optimizer fused-sgd but this run has --optimizer sgd; resume with the checkpoint's settings, or start afresh without --resume"
  ARGS --data "${_fixture}/good" --precision fp16 --init-scale 1048576 --growth-interval 3
    --epochs 5 --resume --checkpoint
    "${CMAKE_CURRENT_BINARY_DIR}/mnist_linear/resumes_fp16_with_fused_sgd_exactly_as_an_uninterrupted_run/split.pt")
set_tests_properties(example.mnist_linear.refuses_a_checkpoint_of_another_optimizer PROPERTIES
  DEPENDS example.mnist_linear.resumes_fp16_with_fused_sgd_exactly_as_an_uninterrupted_run)
amp_example_run(mnist_linear rejects_resume_without_a_checkpoint_file EXIT 1
  OUTPUT "mnist_linear: error: --resume: there is no checkpoint at '[^']*no-such-checkpoint.pt'; run once without --resume to create it"
  ARGS --data "${_fixture}/good" --checkpoint "${CMAKE_CURRENT_BINARY_DIR}/mnist_linear/no-such-checkpoint.pt" --resume)
amp_example_run(mnist_linear rejects_a_file_that_is_not_a_checkpoint EXIT 1
  OUTPUT "mnist_linear: error: cannot read the checkpoint '[^']*train-labels-idx1-ubyte' \\(damaged, truncated or not a checkpoint\\): "
  ARGS --data "${_fixture}/good" --checkpoint "${_fixture}/good/train-labels-idx1-ubyte" --resume)
amp_example_run(mnist_linear rejects_resume_without_the_checkpoint_option EXIT 2
  OUTPUT "mnist_linear: error: --resume continues from a checkpoint; name it with --checkpoint PATH.*usage: mnist_linear"
  ARGS --data "${_fixture}/good" --resume)
amp_example_run(mnist_linear rejects_a_value_given_to_the_resume_flag EXIT 2
  OUTPUT "mnist_linear: error: option --resume is a flag and takes no value; write --resume alone"
  ARGS --resume=yes)

# --metrics and the summary: fp16 whose initial scale overflows (2 steps skipped in epoch 1, scale
# 2^18 after), 4 epochs of 4 steps, a row every 2 steps. Rows: steps 2, 6, 10, 14 (mid-epoch) and
# one per epoch (steps 4, 8, 12, 16: the epoch row replaces the step row there) = 8 rows.
set(_metrics_csv "${CMAKE_CURRENT_BINARY_DIR}/mnist_linear/metrics/fixture-fp16.csv")
add_test(NAME example.mnist_linear.writes_metrics_and_a_summary
  COMMAND "${CMAKE_COMMAND}" "-DPROGRAM=$<TARGET_FILE:mnist_linear>"
    "-DARGS=--data|${_fixture}/good|--epochs|4|--precision|fp16|--init-scale|1048576|--metrics-every|2"
    "-DCSV=${_metrics_csv}" -DEXPECT_ROWS=8 -DEXPECT_EPOCHS=4
    "-DLAST_ROW=^fp16,4,16,[0-9.]+,262144,2,[0-9.]+,[0-9.]+,100.00$"
    "-DEXPECT_OUTPUT=metrics: a row every 2 steps and one per epoch to [^\n]*fixture-fp16.csv\n.*summary: precision fp16, test accuracy 100.00%, final train loss [0-9]+\\.[0-9]+, [0-9]+ samples/s, peak memory [0-9.]+ MiB \\(max RSS\\), skipped steps 2 of 16\n"
    -P "${CMAKE_CURRENT_LIST_DIR}/check_metrics.cmake")
set_tests_properties(example.mnist_linear.writes_metrics_and_a_summary PROPERTIES
  FIXTURES_REQUIRED example_idx_fixture FIXTURES_SETUP mnist_metrics_csv LABELS example)
# The plotting script on that CSV (skipped when the venv has no matplotlib).
add_test(NAME example.mnist_linear.plots_the_metrics
  COMMAND "${CMAKE_COMMAND}" "-DPYTHON=${AMP_PYTHON}"
    "-DSCRIPT=${PROJECT_SOURCE_DIR}/scripts/plot-metrics" "-DCSV=${_metrics_csv}"
    "-DPNG=${CMAKE_CURRENT_BINARY_DIR}/mnist_linear/metrics/fixture-fp16.png"
    -P "${CMAKE_CURRENT_LIST_DIR}/check_plot.cmake")
set_tests_properties(example.mnist_linear.plots_the_metrics PROPERTIES
  FIXTURES_REQUIRED mnist_metrics_csv LABELS example SKIP_REGULAR_EXPRESSION "SKIPPED: matplotlib")
# --compare: fp32 then fp16 from the same seed, both summaries, then the side-by-side table.
amp_example_run(mnist_linear compares_fp32_with_fp16_side_by_side EXIT 0
  OUTPUT "summary: precision fp32, [^\n]*, skipped steps 0 \\(no loss scaling\\)\n.*summary: precision fp16, .*compare: fp32 vs fp16 \\(seed 0: same initial weights, same batches\\)\nepoch +fp32 loss +fp32 acc +fp16 loss +fp16 acc\n1/2 +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+%\n2/2 +[0-9.]+ +[0-9.]+% +[0-9.]+ +[0-9.]+%\ntraining +[0-9.]+ s +[0-9.]+ s\naccuracy difference \\(fp16 - fp32\\): [-+][0-9]+\\.[0-9]+ points\n$"
  ARGS --data "${_fixture}/good" --epochs 2 --precision fp16 --compare)
amp_example_run(mnist_linear rejects_compare_with_fp32 EXIT 2
  OUTPUT "^mnist_linear: error: --compare trains fp32 against a mixed precision, so --precision fp32 leaves nothing to compare; use --precision bf16 or --precision fp16\n\nusage: mnist_linear"
  ARGS --compare --precision fp32)
amp_example_run(mnist_linear rejects_compare_with_a_checkpoint EXIT 2
  OUTPUT "^mnist_linear: error: --compare trains two models from scratch and saves no checkpoint; drop --checkpoint"
  ARGS --compare --checkpoint "${CMAKE_CURRENT_BINARY_DIR}/mnist_linear/compare.pt")
amp_example_run(mnist_linear rejects_an_unwritable_metrics_file EXIT 1
  OUTPUT "^mnist_linear: error: cannot write the metrics file '[^']*no-such-folder/m.csv': No such file or directory; name a writable path with --metrics FILE\n$"
  ARGS --data "${_fixture}/good" --metrics "${_fixture}/no-such-folder/m.csv")
amp_example_run(mnist_linear rejects_zero_metrics_steps EXIT 2
  OUTPUT "error: --metrics-every must be a whole number from 1 to [0-9]+, not '0'"
  ARGS --metrics-every 0)

amp_example_run(mnist_linear prints_help EXIT 0
  OUTPUT "usage: mnist_linear .*--optimizer \\{sgd,fused-sgd\\}.*--precision \\{fp32,bf16,fp16,fp8\\}.*--fp8-recipe.*--device \\{cpu,cuda\\}.*--resume\\].*--data DIR"
  ARGS --help)
amp_example_run(mnist_linear rejects_an_unknown_option EXIT 2
  OUTPUT "mnist_linear: error: unknown option '--frobnicate'.*usage: mnist_linear"
  ARGS --frobnicate 3)
amp_example_run(mnist_linear rejects_a_missing_value EXIT 2
  OUTPUT "error: option --lr needs a value \\(RATE\\).*usage: mnist_linear"
  ARGS --epochs 1 --lr)
amp_example_run(mnist_linear rejects_zero_epochs EXIT 2
  OUTPUT "error: --epochs must be a whole number from 1 to [0-9]+, not '0'"
  ARGS --epochs=0)
amp_example_run(mnist_linear rejects_an_unknown_optimizer EXIT 2
  OUTPUT "error: --optimizer must be one of sgd, fused-sgd, not 'adam'"
  ARGS --optimizer adam)
amp_example_run(mnist_linear rejects_an_unknown_precision EXIT 2
  OUTPUT "error: --precision must be one of fp32, bf16, fp16, fp8, not 'fp64'"
  ARGS --precision fp64)
amp_example_run(mnist_linear rejects_a_negative_learning_rate EXIT 2
  OUTPUT "error: --lr must be a finite number greater than 0, not '-1'"
  ARGS --lr -1)

amp_example_run(mnist_linear reports_a_missing_data_folder EXIT 1
  OUTPUT "error: [^\n]*no-such-folder: the data folder does not exist.*--data DIR names a folder"
  ARGS --data "${_fixture}/no-such-folder")
amp_example_run(mnist_linear reports_a_missing_file EXIT 1
  OUTPUT "missing_file: missing data file: neither t10k-images-idx3-ubyte nor t10k-images-idx3-ubyte.gz exists"
  ARGS --data "${_fixture}/missing_file")
amp_example_run(mnist_linear reports_a_truncated_file EXIT 1
  OUTPUT "t10k-images-idx3-ubyte: truncated: the header promises 64 x 28 x 28 values \\(50176 bytes of data\\) but the file has only 50076 bytes"
  ARGS --data "${_fixture}/truncated")
amp_example_run(mnist_linear reports_a_truncated_gzip_file EXIT 1
  OUTPUT "train-images-idx3-ubyte.gz: the gzip stream is corrupt or truncated"
  ARGS --data "${_fixture}/truncated_gz")
amp_example_run(mnist_linear reports_a_bad_magic_number EXIT 1
  OUTPUT "train-labels-idx1-ubyte: bad magic number 0x00000803; expected 0x00000801"
  ARGS --data "${_fixture}/bad_magic")
amp_example_run(mnist_linear reports_mismatched_counts EXIT 1
  OUTPUT "t10k-images-idx3-ubyte holds 64 images but [^\n]*t10k-labels-idx1-ubyte.gz holds 63 labels"
  ARGS --data "${_fixture}/mismatched")
amp_example_run(mnist_linear reports_a_label_out_of_range EXIT 1
  OUTPUT "train-labels-idx1-ubyte: label 10 at index 17 is out of range; labels must be below 10"
  ARGS --data "${_fixture}/bad_label")

# The example as its own CMake project, finding amp through CMAKE_PREFIX_PATH as its README
# shows, run for one epoch on the fixture.
if(DEFINED _amp_prefix)
  amp_example_standalone(mnist_linear BY_PREFIX_PATH
    PASS "done: precision bf16, test accuracy [0-9.]+%"
    COMMAND mnist_linear --data "${_fixture}/good" --epochs 1)
endif()
