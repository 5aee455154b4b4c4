# tests/test_cli.cmake: end-to-end tests of the executables (tests/cli/*.sh), registered
# directly with add_test. Each runs fsdp_train under `mpirun -np 2` (or fsdp_prepare) in a
# temporary directory and checks exit codes, the one-line error contract (docs/config.md
# "Errors"), metrics.jsonl and the checkpoint layout; signals.sh stops runs with signals and
# checks the watchdog. Included by tests/CMakeLists.txt.
set(FSDP_CLI_ARGS $<TARGET_FILE:fsdp_train> $<TARGET_FILE:fsdp_prepare> ${MPIEXEC_EXECUTABLE})

# fsdp_cli_tests(SCRIPT PREFIX NP CASE... [ENV VAR=VALUE...] [SKIP_RETURN_CODE CODE]
#                [MPIRUN_TEARDOWN]): one ctest PREFIX_CASE per case of tests/cli/SCRIPT.sh, on
# NP processors, with FSDP_TEST_ENV plus the ENV entries. SKIP_RETURN_CODE: the code with which
# a case says it cannot run here (77: no mount, no spm_train), reported as not run.
#
# mpirun waits odls_base_sigkill_timeout (Open MPI's default: 1 s) before it ends a job in
# which a rank exited non-zero, even when every rank has already exited (mpirun -np 2 of a
# program whose ranks call MPI_Finalize and return 2: 1.8 s, 0.8 s with the timeout 0). A run
# that fails through the agreed error path ends that way: every rank prints or not, calls
# MPI_Finalize and exits by itself, so the wait only costs time: the cases run with it 0
# (cli_bad_input, cli_integrity and cli_profile: 143 s -> 61 s; a run that a rank's abort
# ends instead sees its survivors killed at once, never later than with the default). MPIRUN_TEARDOWN keeps the
# default for scripts whose runs mpirun itself ends (SIGCONT, SIGTERM, SIGKILL, that timeout
# apart: docs/checkpoint.md "Signals"): the teardown users get is what they test.
function(fsdp_cli_tests SCRIPT PREFIX NP)
  cmake_parse_arguments(C "MPIRUN_TEARDOWN" "SKIP_RETURN_CODE" "ENV" ${ARGN})
  set(env ${FSDP_TEST_ENV} ${C_ENV})
  if(NOT C_MPIRUN_TEARDOWN)
    list(APPEND env OMPI_MCA_odls_base_sigkill_timeout=0)
  endif()
  foreach(case IN LISTS C_UNPARSED_ARGUMENTS)
    add_test(NAME ${PREFIX}_${case}
             COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/cli/${SCRIPT}.sh ${FSDP_CLI_ARGS} ${case})
    set_tests_properties(${PREFIX}_${case} PROPERTIES ENVIRONMENT "${env}"
                         LABELS "cpu;cli" TIMEOUT 300 PROCESSORS ${NP})
    if(DEFINED C_SKIP_RETURN_CODE)
      set_tests_properties(${PREFIX}_${case} PROPERTIES SKIP_RETURN_CODE ${C_SKIP_RETURN_CODE})
    endif()
  endforeach()
endfunction()

fsdp_cli_tests(bad_input cli_bad_input 2
  malformed_toml unknown_key unknown_key_set unknown_section wrong_type out_of_range_set
  negative_peak_flops pad_vocab_multiple
  bad_set_syntax missing_config no_config_argument unknown_option mixture_errors document_masking_errors missing_data_path
  missing_data_file not_hdf5_file truncated_hdf5 missing_val_dataset vocab_mismatch seq_len_too_long
  seq_len_longer_than_data key_of_another_class unknown_strategy unknown_dtype micro_batch_not_dividing n_embd_not_divisible batch_not_divisible
  shard_size_not_dividing shard_size_not_dividing_full_shard world_size_without_dry_run
  world_size_not_divisible
  config_differs_between_ranks data_differs_between_ranks build_differs_between_ranks
  resume_without_checkpoint
  init_from_missing_dir init_from_checkpoint init_from_wrong_shape)
fsdp_cli_tests(smoke cli_smoke 2 train hdf5 mixture mixed_precision dry_run dry_run_world_size t5_dry_run
  threads_bound_by_mpirun help version list_keys model_from input_headers)
fsdp_cli_tests(run_dir cli_run_dir 2 refuse_fresh_run resume second_run_refused stale_lock_taken_over
  refuse_step_dirs_without_latest refuse_metrics_only checkpoints_unwritable_at_start
  checkpoints_read_only_fs resume_auto_fresh resume_auto_continues
  save_total_limit not_shared)
# A read-only tmpfs: needs root and mount; exit 77 (skipped) otherwise.
set_tests_properties(cli_run_dir_checkpoints_read_only_fs PROPERTIES SKIP_RETURN_CODE 77)
fsdp_cli_tests(prepare cli_prepare 1 ok compressed errors output_is_input output_inside_input_dir fifo_input
  fifo_data_path group_not_dataset corrupted_header concurrent_output)
# fsdp_prepare --tokenizer (SentencePiece, tokenizer.json) and --token-file (llm.c, nanoGPT),
# and training on their files (tests/cli/tokenizers.sh). spm_train (Debian package
# sentencepiece) trains the models and js-tiktoken (npm, tools/install_deps.sh) is the BPE
# reference: exit 77 (skipped) without them.
fsdp_cli_tests(tokenizers cli_tokenizers 2 sentencepiece_ok sentencepiece_errors token_files_ok
  token_files_errors hf_bpe_gpt2 hf_bpe_llama3 hf_bpe_o200k hf_bpe_errors train
  SKIP_RETURN_CODE 77)
# A small tmpfs as train.run_dir: needs root and mount; exit 77 (skipped) otherwise.
fsdp_cli_tests(disk_full cli_disk_full 2 save_enospc save_enospc_async metrics_enospc prepare_enospc
  save_too_big_warned merge_enospc SKIP_RETURN_CODE 77)
# checkpoint.async_save (tests/cli/async_save.sh): same bytes as synchronous saves, SIGKILL
# while a background write is in flight.
fsdp_cli_tests(async_save cli_async_save 2 same_as_sync sigkill_during_write signal_with_save_in_flight
  ENV FSDP_MERGE=$<TARGET_FILE:fsdp_merge> MPIRUN_TEARDOWN)
fsdp_cli_tests(guards cli_guards 2 lr_too_large diverge_stops diverge_stops_async diverge_skips
  memory_too_large memory_too_large_offload)
fsdp_cli_tests(signals cli_signals 2
  sigterm_rank sigusr1_rank sigterm_mpirun sigint_mpirun sigusr1_mpirun second_sigint_exits_now sigstop_rank
  sigkill_rank sigusr1_offload
  sigusr1_offload_optimizer sigusr1_delayed_update sigusr1_checkpoint_disabled MPIRUN_TEARDOWN)

# Checkpoint integrity (tests/cli/integrity.sh): corrupted, mixed-step, mixed-run and
# incompatible checkpoints. fsdp_h5_poke edits HDF5 attributes, finds dataset offsets and
# reseals a shard file's metadata checksum (fsdp::checkpoint's metadata_checksum; no h5py
# needed). Cases of issue 29: shard_from_other_run and
# run_id_kept_on_resume (run and launch ids), tampered_metadata (the metadata checksum),
# merge_into_checkpoints (fsdp_merge's OUT_DIR).
add_executable(fsdp_h5_poke cli/h5_poke.cpp)
target_link_libraries(fsdp_h5_poke PRIVATE hdf5::hdf5 fsdp::checkpoint)
set(FSDP_INTEGRITY_CASES shard_from_other_step flipped_byte resume_changed_key bad_step_attr
    max_steps_below garbage_latest shard_from_other_run run_id_kept_on_resume tampered_metadata
    merge_into_checkpoints merge_concurrent merge_latest resume_step)
fsdp_cli_tests(integrity cli_integrity 2 ${FSDP_INTEGRITY_CASES}
  ENV FSDP_MERGE=$<TARGET_FILE:fsdp_merge> FSDP_H5_POKE=$<TARGET_FILE:fsdp_h5_poke>)

# The merged model's loss is the trainer's (tests/cli/merge_loss.sh; check_merge.py's numpy GPT-2).
fsdp_cli_tests(merge_loss cli_merge_loss 2 gpt2 llama
  ENV FSDP_MERGE=$<TARGET_FILE:fsdp_merge> FSDP_TEST_PYTHON=${FSDP_TEST_PYTHON})

# Resume on another world size or mesh (tests/cli/reshard.sh): phases under mpirun -np 4, 2, 1.
fsdp_cli_tests(reshard cli_reshard 4 np_4_2_1_4 hybrid_to_full
  ENV FSDP_MERGE=$<TARGET_FILE:fsdp_merge>)
