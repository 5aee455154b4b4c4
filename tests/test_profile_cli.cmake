# tests/test_profile_cli.cmake: fsdp_train --profile and tools/profile_summary.py end to end
# (tests/cli/profile.sh). Uses fsdp_cli_tests() from tests/test_cli.cmake, which the glob
# includes first (alphabetical order).
fsdp_cli_tests(profile cli_profile 2 option summary bad_values)
