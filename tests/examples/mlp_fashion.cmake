# mlp_fashion's runs (included by CMakeLists.txt): training in each precision on the fixture,
# clipping, skipped fp16 steps, exact resume after --stop-after, the same with FusedAdamW,
# refused checkpoints, bad options, and a standalone build.

# 16 images per pass, 2 passes per AdamW step: 8 steps per epoch on the fixture.
set(_mlp_args --data "${_fixture}/good" --batch-size 16 --accumulate 2 --warmup-steps 4)
set(_logits_fp32 Float)
set(_logits_bf16 BFloat16)
set(_logits_fp16 Half)
foreach(_precision IN ITEMS fp32 bf16 fp16)
  set(_scale "")
  if(_precision STREQUAL "fp16")
    set(_scale ", loss scale [0-9.e+]+, skipped steps [0-9] of 8")
  endif()
  amp_example_run(mlp_fashion learns_the_fixture_in_${_precision} EXIT 0 EPOCHS 2 MIN_ACCURACY 90
    OUTPUT "batch size 16 x 2 accumulated, 8 steps per epoch.*forward pass: logits ${_logits_${_precision}}, loss Float.*epoch 2/2: [^\n]*\\(clipped [0-8] of [0-8] steps\\), next lr [^,]+${_scale}, [0-9.]+ s\n"
    ARGS ${_mlp_args} --epochs 2 --precision ${_precision})
endforeach()
# Float8 layers (amp::fp8, emulated on the CPU) learn the fixture with each recipe; the logits
# follow bf16 autocast. Skipped on a LibTorch whose CPU float8 GEMM takes no rowwise scales (2.11).
# One epoch: LibTorch's CPU float8 GEMM makes an epoch of this model take about 8 s here (bf16:
# 0.03 s), and the fixture is learnt in the first.
foreach(_recipe IN ITEMS tensorwise rowwise delayed)
  amp_example_run(mlp_fashion learns_the_fixture_in_fp8_${_recipe} EXIT 0 EPOCHS 1 MIN_ACCURACY 90
    OUTPUT "precision fp8 \\(float8 GEMMs in bfloat16 autocast\\).*forward pass: logits BFloat16, loss Float.*epoch 1/1: "
    SKIP_IF "rowwise scales on the CPU need a LibTorch whose CPU at::_scaled_mm takes them"
    ARGS ${_mlp_args} --epochs 1 --precision fp8 --fp8-recipe ${_recipe})
endforeach()
# bf16 weights with Kahan summation and the compact bf16 moments (--state-dtype; fp32 is the
# library's default) learn the fixture too; --state-dtype alone is a usage error.
amp_example_run(mlp_fashion learns_the_fixture_with_bf16_weights_and_moments EXIT 0 EPOCHS 2
  MIN_ACCURACY 90
  OUTPUT "weights: bf16, updates kept by Kahan summation, bf16 moments\n.*epoch 2/2: "
  ARGS ${_mlp_args} --epochs 2 --weights bf16 --low-precision kahan --state-dtype bf16)
amp_example_run(mlp_fashion rejects_a_state_dtype_without_low_precision EXIT 2
  OUTPUT "mlp_fashion: error: --state-dtype bf16 sets the moments' dtype of --low-precision master, kahan or sr; add one of them."
  ARGS ${_mlp_args} --state-dtype bf16)
amp_example_run(mlp_fashion rejects_an_fp8_recipe_without_fp8 EXIT 2
  OUTPUT "mlp_fashion: error: --fp8-recipe rowwise applies to --precision fp8 \\(got --precision bf16\\)"
  ARGS ${_mlp_args} --fp8-recipe rowwise)
amp_example_run(mlp_fashion rejects_an_unknown_fp8_recipe EXIT 2
  OUTPUT "mlp_fashion: error: --fp8-recipe blockwise is not a recipe; use tensorwise, rowwise, rowwise_with_gw_hp or delayed"
  ARGS ${_mlp_args} --precision fp8 --fp8-recipe blockwise)
# --recompute-activations (amp::checkpoint around the hidden layers; no dropout in this model)
# changes no number: under bf16 autocast, fp16 with the scaler skipping overflowing steps, and
# float8 with delayed scaling, whose recomputation must reuse the forward's scales.
# (float8 for one epoch, as above: its 8 steps move the delayed histories on every step.)
foreach(_case IN ITEMS "bf16|--epochs|2|--precision|bf16"
                       "fp16|--epochs|2|--precision|fp16|--init-scale|4194304"
                       "fp8_delayed|--epochs|1|--precision|fp8|--fp8-recipe|delayed")
  string(REPLACE "|" ";" _case "${_case}")
  list(POP_FRONT _case _label)
  amp_example_same(mlp_fashion recomputes_activations_exactly_in_${_label}
    EXTRA --recompute-activations
    MARK "parameters, hidden activations recomputed in backward \\(amp::checkpoint\\)"
    ARGS ${_mlp_args} ${_case})
endforeach()
# A norm bound far below the gradients' clips every step, and the report counts them.
amp_example_run(mlp_fashion clips_every_step_through_the_scaler EXIT 0 EPOCHS 2
  OUTPUT "epoch 1/2: [^\n]*\\(clipped 8 of 8 steps\\)[^\n]*\nepoch 2/2: [^\n]*\\(clipped 8 of 8 steps\\)[^\n]*, loss scale"
  ARGS ${_mlp_args} --epochs 2 --precision fp16 --clip 0.001)
# An initial scale of 2^22 overflows the first steps' float16 gradients: the scaler skips them
# (clipping counts only the steps taken) and backs off until the scale fits; then training goes on.
# The loop counts the steps taken from the scaler's flag on the device ("clipped C of T steps"),
# the scaler's counters count the skipped ones ("skipped steps S of 8"): T + S must be 8.
set(_taken_and_skipped "")
foreach(_skipped RANGE 1 7)
  math(EXPR _taken "8 - ${_skipped}")
  list(APPEND _taken_and_skipped "of ${_taken} steps\\)[^\n]*, skipped steps ${_skipped} of 8,")
endforeach()
list(JOIN _taken_and_skipped "|" _taken_and_skipped)
set(_overflowing_epoch_1 "epoch 1/2: [^\n]*\\(clipped [0-7] (${_taken_and_skipped})[^\n]*\n")
amp_example_run(mlp_fashion skips_overflowing_fp16_steps EXIT 0 EPOCHS 2
  OUTPUT "${_overflowing_epoch_1}epoch 2/2: [^\n]*\\(clipped [0-8] of 8 steps\\)[^\n]*, skipped steps 0 of 8,"
  ARGS ${_mlp_args} --epochs 2 --precision fp16 --init-scale 4194304)
# The same with FusedAdamW, which takes or skips each step on the device.
amp_example_run(mlp_fashion skips_overflowing_fp16_steps_with_fused_adamw EXIT 0 EPOCHS 2
  MIN_ACCURACY 90
  OUTPUT "FusedAdamW lr 0.001 .*${_overflowing_epoch_1}epoch 2/2: [^\n]*\\(clipped [0-8] of 8 steps\\)[^\n]*, skipped steps 0 of 8,"
  ARGS ${_mlp_args} --epochs 2 --precision fp16 --init-scale 4194304 --optimizer fused-adamw)

# 3 epochs in one go against 1 epoch, stopped by --stop-after, + --resume. From an overflowing
# initial scale, the checkpoint's scale, growth tracker and skip counts differ from a fresh
# scaler's, so a resume that lost any of them would print other lines.
amp_example_resume(mlp_fashion resumes_fp16_exactly EPOCHS 3 STOP_AFTER 1 STOP_WITH stop-after
  ARGS ${_mlp_args} --precision fp16 --init-scale 4194304)
amp_example_resume(mlp_fashion resumes_bf16_exactly EPOCHS 3 STOP_AFTER 1 STOP_WITH stop-after
  ARGS ${_mlp_args} --precision bf16)
# FusedAdamW's state (its step counts live in tensors, rolled back on skipped steps) through a
# checkpoint.
amp_example_resume(mlp_fashion resumes_fp16_exactly_with_fused_adamw EPOCHS 3 STOP_AFTER 1
  STOP_WITH stop-after
  ARGS ${_mlp_args} --precision fp16 --init-scale 4194304 --optimizer fused-adamw)

# The same through --checkpoint-format python (Python's state_dict()s in a torch.save dict): the
# overflowing fp16 scaler, FusedAdamW's state and the shuffling survive the Python layout.
amp_example_resume(mlp_fashion resumes_fp16_exactly_from_python_format_checkpoints EPOCHS 3
  STOP_AFTER 1 STOP_WITH stop-after
  ARGS ${_mlp_args} --precision fp16 --init-scale 4194304 --checkpoint-format python)
# mlp_fashion and train.py (the loop in Python) continue each other's runs bit for bit, both ways
# (check_cross_language_resume.cmake): each optimizer (FusedAdamW against AdamW(fused=True),
# amp::optim::AdamW against Python's single-tensor AdamW), and fp16 with an initial scale that
# overflows, so both scalers skip steps in epoch 1, back off and carry the scale (in the epoch
# lines) and the growth tracker across. --clip 1e9 never clips: with clipping, amp's fused
# unscale_and_clip_ multiplies once where clip_grad_norm_ rounds twice, and the last bits differ.
list(JOIN _mlp_args "|" _joined)
foreach(_case IN ITEMS "bf16|--precision|bf16" "fp32|--precision|fp32"
                       "fp16|--precision|fp16|--init-scale|4194304"
                       "fp16_with_adamw|--precision|fp16|--init-scale|4194304|--optimizer|adamw")
  string(FIND "${_case}" "|" _bar)
  string(SUBSTRING "${_case}" 0 ${_bar} _name)
  string(SUBSTRING "${_case}" ${_bar} -1 _case_args)
  set(_test example.mlp_fashion.continues_python_runs_and_python_continues_its_runs_in_${_name})
  set(_expect "")
  if(_name MATCHES "^fp16")
    # Within epoch 1's line (its characters, no newline): steps were skipped.
    set(_expect "-DEXPECT=epoch 1/3: [-a-z0-9 .,%()]*, skipped steps [1-9][0-9]* of")
  endif()
  add_test(NAME ${_test}
    COMMAND "${CMAKE_COMMAND}" "-DPROGRAM=$<TARGET_FILE:mlp_fashion>" "-DPYTHON=${AMP_PYTHON}"
      "-DSCRIPT=${PROJECT_SOURCE_DIR}/examples/mlp_fashion/train.py"
      "-DARGS=${_joined}${_case_args}|--clip|1e9" -DEPOCHS=3 -DSTOP_AFTER=1
      ${_expect}
      "-DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/mlp_fashion/cross_language_${_name}"
      -P "${CMAKE_CURRENT_LIST_DIR}/check_cross_language_resume.cmake")
  set_tests_properties(${_test} PROPERTIES FIXTURES_REQUIRED example_idx_fixture LABELS example)
endforeach()

# The bf16 resume test's checkpoint, after epoch 1 of 3 (24 steps), resumed with other settings.
set(_bf16_checkpoint "${CMAKE_CURRENT_BINARY_DIR}/mlp_fashion/resumes_bf16_exactly/split.pt")
amp_example_run(mlp_fashion refuses_a_checkpoint_of_other_settings EXIT 1
  OUTPUT "mlp_fashion: error: the checkpoint '[^']*resumes_bf16_exactly/split.pt' was written with accumulate 2 but this run has accumulate 4; resume with the checkpoint's settings, or start afresh without --resume"
  ARGS --data "${_fixture}/good" --batch-size 16 --accumulate 4 --warmup-steps 4 --precision bf16
    --epochs 3 --checkpoint "${_bf16_checkpoint}" --resume)
amp_example_run(mlp_fashion refuses_a_checkpoint_of_another_schedule EXIT 1
  OUTPUT "mlp_fashion: error: the checkpoint '[^']*split.pt' follows a learning-rate schedule of 24 steps but this run's has 40; resume with the --epochs the checkpoint was started with"
  ARGS ${_mlp_args} --precision bf16 --epochs 5 --checkpoint "${_bf16_checkpoint}" --resume)
# The optimizers read each other's state, but a run continues with the one it started with.
amp_example_run(mlp_fashion refuses_a_checkpoint_of_another_optimizer EXIT 1
  OUTPUT "mlp_fashion: error: the checkpoint '[^']*split.pt' was written with --optimizer fused-adamw but this run has --optimizer adamw; resume with the checkpoint's settings, or start afresh without --resume"
  ARGS ${_mlp_args} --precision bf16 --epochs 3 --optimizer adamw
    --checkpoint "${_bf16_checkpoint}" --resume)
set_tests_properties(example.mlp_fashion.refuses_a_checkpoint_of_other_settings
  example.mlp_fashion.refuses_a_checkpoint_of_another_schedule
  example.mlp_fashion.refuses_a_checkpoint_of_another_optimizer PROPERTIES
  DEPENDS example.mlp_fashion.resumes_bf16_exactly)
amp_example_run(mlp_fashion rejects_resume_without_a_checkpoint_file EXIT 1
  OUTPUT "mlp_fashion: error: --resume: there is no checkpoint at '[^']*none.pt'; run once without --resume to create it"
  ARGS ${_mlp_args} --checkpoint "${CMAKE_CURRENT_BINARY_DIR}/mlp_fashion/none.pt" --resume)
amp_example_run(mlp_fashion rejects_an_unknown_optimizer EXIT 2
  OUTPUT "mlp_fashion: error: --optimizer must be one of adamw, fused-adamw, not 'sgd'.*usage: mlp_fashion"
  ARGS --optimizer sgd)
amp_example_run(mlp_fashion rejects_zero_accumulation EXIT 2
  OUTPUT "mlp_fashion: error: --accumulate must be a whole number from 1 to [0-9]+, not '0'.*usage: mlp_fashion"
  ARGS --accumulate 0)
amp_example_run(mlp_fashion prints_help EXIT 0
  OUTPUT "usage: mlp_fashion .*--accumulate N.*--optimizer \\{adamw,fused-adamw\\}.*--clip NORM.*--precision \\{fp32,bf16,fp16,fp8\\}.*--fp8-recipe.*--device \\{cpu,cuda\\}.*--resume.*--stop-after N.*--recompute-activations"
  ARGS --help)
amp_example_run(mlp_fashion rejects_cuda_without_a_gpu EXIT 1
  SKIP_IF "device cuda, epochs"
  OUTPUT "^mlp_fashion: error: --device cuda needs a CUDA GPU, but none is available \\(no GPU or driver on this machine, or a LibTorch built without CUDA\\); run on the CPU with --device cpu\n$"
  ARGS ${_mlp_args} --device cuda)

if(DEFINED _amp_prefix)
  amp_example_standalone(mlp_fashion
    PASS "epoch 1/1: [^\n]*\nparameters: fingerprint [0-9a-f]+\ndone: precision fp16, test accuracy [0-9.]+%"
    COMMAND mlp_fashion ${_mlp_args} --epochs 1 --precision fp16)
endif()
