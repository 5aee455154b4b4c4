# tests/test_plot.cmake: tools/plot_run.py end to end (tests/cli/plot.sh): a real 2-rank
# tiny run and hand-written metrics.jsonl files plotted to PNG, and its one-line errors.
# Uses fsdp_cli_tests() from tests/test_cli.cmake, so it must be included after it:
# tests/CMakeLists.txt includes the test_*.cmake files in glob (alphabetical) order, and
# test_cli.cmake sorts before test_plot.cmake.
fsdp_cli_tests(plot cli_plot 2 small_run fixture)
