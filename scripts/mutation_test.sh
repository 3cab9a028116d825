#!/usr/bin/env bash
# Mutation testing of the weights/resume code and the LDT-S core with mutmut 3 (not part of CI, not
# collected by pytest; see docs/development.md, "Mutation testing").
#
#   scripts/mutation_test.sh             copy the working tree to $MUTATION_DIR, run every mutant, summarise
#   scripts/mutation_test.sh --resume    continue an interrupted run in $MUTATION_DIR (no new copy)
#   scripts/mutation_test.sh --retest    bring the working tree's tests/ into $MUTATION_DIR and rerun only
#                                        the mutants that survived or had no test (after adding tests)
#
# The run happens in a scratch copy of the working tree (tracked and untracked, not ignored files),
# so editing code or tests while it runs changes nothing in it, and mutmut's mutants/ folder never
# lands in the repository. Environment: MUTATION_DIR (default /tmp/basicsr-ldt-mutation),
# MUTATION_JOBS (mutants run in parallel, default 1), MUTATION_MODULES (space-separated globs of the
# files to mutate, default below; files under basicsr_ldt/ or archs/), MUTATION_NAMES (space-separated
# globs of the mutants to run, to restrict a run to some functions, e.g.
# 'basicsr_ldt.ldt.partition.x_matches__mutmut_*'; the summary then counts only those; default: every
# mutant of MUTATION_MODULES), MUTATION_TESTS (space-separated test files or node ids, to run a restricted
# set of mutants against the tests that reach them only; default: TESTS below),
# MUTATION_TIMEOUT_CONSTANT (seconds, default 10; see write_config),
# OMP_NUM_THREADS (default 1).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${MUTATION_DIR:-/tmp/basicsr-ldt-mutation}"
JOBS="${MUTATION_JOBS:-1}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}" CUDA_VISIBLE_DEVICES=''
PYTHON="$(cd "$REPO" && source scripts/python_env.sh && echo "$PY")"   # the project's interpreter

# What is mutated by default: the weights/resume code, the LDT-S/EMA core and the DRealSR loader
# (cameras, pairing, dataset, sampler). The rest of basicsr_ldt/ldt/ (1,877 mutants, 40 min with
# MUTATION_JOBS=2 on 2 cores): MUTATION_MODULES='basicsr_ldt/ldt/algorithm.py basicsr_ldt/ldt/config.py ...'
# (docs/development.md, "Mutation testing").
read -r -a MODULES <<< "${MUTATION_MODULES:-basicsr_ldt/ldt/ldt_s.py basicsr_ldt/ldt/equations.py \
basicsr_ldt/weights/checkpoint.py basicsr_ldt/weights/releases.py basicsr_ldt/weights/fetch.py basicsr_ldt/models/resumable.py \
basicsr_ldt/pipelines/train.py basicsr_ldt/data/cameras.py basicsr_ldt/data/drealsr_dataset.py basicsr_ldt/data/sampler.py}"
read -r -a NAMES <<< "${MUTATION_NAMES:-}"
# The tests that run that code in-process. mutmut maps tests to functions by tracing the pytest process,
# so a test that only drives Train_pip.py/test.py in a subprocess cannot kill a mutant (the mutated
# code there runs outside mutmut's control and fails): those are left out or deselected.
TESTS=(
  tests/test_ldt_algorithm.py tests/test_ldt_config.py tests/test_ldt_pair.py tests/test_ldt_partition.py
  tests/test_ldt_reference.py tests/test_ldt_s.py tests/test_ldt_statistics.py tests/test_precision.py
  tests/test_typed_options.py tests/test_checkpoint.py tests/test_fetch_weights.py tests/test_best_checkpoint.py
  tests/test_resumable_model.py tests/test_dataset.py tests/test_camera_sampler.py tests/test_drealsr_real_names.py
  tests/test_archs.py tests/test_inference.py tests/test_validation_inference.py tests/test_ldt_model.py
  tests/test_scan_launches.py
)
if [[ -n "${MUTATION_TESTS:-}" ]]; then read -r -a TESTS <<< "$MUTATION_TESTS"; fi
SUBPROCESS_TESTS=(
  tests/test_precision.py::test_bf16_ldt_run_through_every_phase_then_bf16_test
  tests/test_fetch_weights.py::test_command_line_list_and_unreachable
  tests/test_best_checkpoint.py::test_best_iteration_weights_are_saved_and_survive_resume
  tests/test_best_checkpoint.py::test_plain_srmodel_is_refused_before_training
  tests/test_drealsr_real_names.py::test_train_pip_stops_before_training_on_an_unknown_prefix
  tests/test_inference.py::test_folder_with_a_corrupt_file
  tests/test_inference.py::test_wrong_checkpoint_fails_before_any_output
  tests/test_inference.py::test_cli_tile_mode_official_writes_the_official_cutting
  tests/test_inference.py::test_cli_bad_flag_is_one_line_on_stderr
  tests/test_inference.py::test_api_tile_warning_points_at_the_callers_line   # mutmut's trampoline is one more frame
  tests/test_validation_inference.py::test_a_bad_val_key_stops_training_before_anything_is_written
  tests/test_validation_inference.py::test_each_validation_set_runs_once_per_validation_iteration
  tests/test_ldt_model.py::test_three_phases_partition_report_and_composite_checkpoint
  tests/test_ldt_model.py::test_resume_in_each_phase_reproduces_the_uninterrupted_run
  tests/test_ldt_model.py::test_baselines_run_as_configurations
  tests/test_ldt_model.py::test_run_prints_no_warning_and_branches_join_the_global_schedule
  tests/test_ldt_model.py::test_a_run_extended_on_resume_says_its_coefficients_keep_their_first_rescaling
  tests/test_corgrad_model.py::test_corgrad_trains_on_camera_balanced_batches_and_resumes_exactly
  tests/test_study.py::test_run_state_skips_finished_runs_and_resumes_started_ones
  tests/test_study.py::test_tiny_study_end_to_end_then_skips_and_collects
  tests/test_study.py::test_live_line_follows_a_training_process
  tests/test_study.py::test_bicubic_method_is_one_untrained_run_paired_with_every_seed
  tests/test_retention_controls.py::test_test_py_refuses_a_bad_wise_ft_entry_in_one_line_and_writes_nothing
  tests/test_compare.py::test_test_py_writes_one_grid_per_image
  tests/test_l2_sp.py::test_a_start_of_another_network_stops_training_in_one_line_before_anything_is_written
  tests/test_optimizers.py::test_a_bad_value_stops_training_in_one_line_before_anything_is_written
)

if ! "$PYTHON" -c 'import mutmut' 2>/dev/null; then
  echo "mutmut is not installed: $PYTHON -m pip install 'mutmut>=3.8,<4'" >&2
  exit 2
fi

copy_tree() {  # files git knows or would add (not ignored), from the working tree, into $1
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard -- "${@:2}" \
     | while IFS= read -r -d '' f; do [[ -e "$f" ]] && printf '%s\0' "$f"; done \
     | tar --null -T - -cf -) | tar -xf - -C "$1"
}

# Besides the mutated packages, what the tests read: entry points, option files, and the docs that the
# docs-consistency tests compare with the code.
ALSO_COPY=(scripts options docs pytest.ini Train_pip.py inference.py test.py README.md CHANGELOG.md)

clean_mutants_folder() {
  # A mutant that changes an output path can leave a run's files (experiments/, results/, metrics.*)
  # in mutants/, where the clean run's tests of a later --resume/--retest find them and fail
  # ("Failed to run clean test"): everything there but the copied code, tests and mutmut's files goes.
  [[ -d "$WORK/mutants" ]] || return 0
  local keep=() p
  for p in basicsr_ldt archs tests setup.cfg 'mutmut-*.json' "${ALSO_COPY[@]}"; do keep+=(! -name "$p"); done
  find "$WORK/mutants" -mindepth 1 -maxdepth 1 "${keep[@]}" -exec rm -rf {} +
}

write_config() {
  {
    echo '[mutmut]'
    echo 'source_paths ='
    echo '    basicsr_ldt'
    echo '    archs'
    echo 'only_mutate ='
    for m in "${MODULES[@]}"; do echo "    $m"; done
    echo 'also_copy ='
    for p in "${ALSO_COPY[@]}"; do echo "    $p"; done
    echo 'pytest_add_cli_args_test_selection ='
    for t in "${TESTS[@]}"; do [[ -e "$WORK/${t%%::*}" ]] && echo "    $t"; done
    echo 'pytest_add_cli_args ='
    for a in -p no:cacheprovider -x -q; do echo "    $a"; done
    for t in "${SUBPROCESS_TESTS[@]}"; do echo "    --deselect"; echo "    $t"; done
    echo 'process_isolation = forkserver'
    echo 'timeout_multiplier = 5'
    # A mutant counts as 'timeout' when its tests run longer than (their recorded time + this) x 5 s
    # of wall time; with mutmut's default of 1 s, a test of 0.1 s timed out whenever the machine was
    # busy (other jobs, nice) and the verdict read as killed. 10 s leaves room; a real hang costs 50 s.
    echo "timeout_constant = ${MUTATION_TIMEOUT_CONSTANT:-10}"
  } > "$WORK/setup.cfg"
}

mode="${1:-fresh}"
rerun=("${NAMES[@]}")
case "$mode" in
  fresh)
    rm -rf "$WORK"; mkdir -p "$WORK"; copy_tree "$WORK" ;;
  --resume) clean_mutants_folder ;;
  --retest)
    # Adding tests cannot let a killed mutant survive, so only the others run again; their new
    # verdicts are laid over the previous ones (mutmut forgets the rest when the test selection changes,
    # so the verdicts of earlier runs, kept in results.txt, are the bottom layer).
    (cd "$WORK" && "$PYTHON" -m mutmut results --all true) > "$WORK/results-now.txt"
    if [[ -s "$WORK/results.txt" ]]; then
      "$PYTHON" "$REPO/scripts/mutation_summary.py" "$WORK/results.txt" "$WORK/results-now.txt" \
        --merged "$WORK/results-before.txt" > /dev/null
    else
      cp "$WORK/results-now.txt" "$WORK/results-before.txt"
    fi
    sed -n 's/^ *\([^ ]*\): \(survived\|no tests\)$/\1/p' "$WORK/results-before.txt" > "$WORK/retest.txt"
    mapfile -t rerun < "$WORK/retest.txt"
    if (( ${#NAMES[@]} )); then   # only the functions MUTATION_NAMES selects
      kept=()
      for m in "${rerun[@]}"; do for n in "${NAMES[@]}"; do [[ "$m" == $n ]] && { kept+=("$m"); break; }; done; done
      rerun=("${kept[@]}")
    fi
    if (( ${#rerun[@]} == 0 )); then echo 'no mutant survived or lacked a test: nothing to rerun'; exit 0; fi
    rm -rf "$WORK/tests"; copy_tree "$WORK" tests; clean_mutants_folder
    echo "rerunning ${#rerun[@]} mutants that survived or had no test" ;;
  *) echo "usage: $0 [--resume|--retest]" >&2; exit 2 ;;
esac
write_config

cd "$WORK"
start=$(date +%s)
if (( ${#rerun[@]} )); then
  "$PYTHON" -m mutmut run --max-children "$JOBS" "${rerun[@]}" > run.log 2>&1 || true
else
  "$PYTHON" -m mutmut run --max-children "$JOBS" > run.log 2>&1 || true
fi
echo "mutmut run took $(( $(date +%s) - start )) s (its output: $WORK/run.log)"
only=()
for n in "${NAMES[@]}"; do only+=(--only "$n"); done
if [[ "$mode" == --retest ]]; then
  "$PYTHON" -m mutmut results --all true > results-retest.txt
  "$PYTHON" "$REPO/scripts/mutation_summary.py" results-before.txt results-retest.txt --merged results.txt "${only[@]}"
else
  "$PYTHON" -m mutmut results --all true > results.txt
  "$PYTHON" "$REPO/scripts/mutation_summary.py" results.txt "${only[@]}"
fi
echo "survivors: grep survived $WORK/results.txt; one mutant's diff: cd $WORK && $PYTHON -m mutmut show <name>"
