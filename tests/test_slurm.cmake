# tests/test_slurm.cmake: tests/slurm/multinode.sh, the CPU multinode job on a real two-node
# Slurm (tools/slurm_local.sh: started by the test unless SLURM_CONF names a running one).
# Label "slurm" only (not "cpu"): it installs Debian's Slurm if missing, needs root and
# namespaces, and takes minutes. Run it with `ctest -L slurm`. Included by tests/CMakeLists.txt.
add_test(NAME slurm_multinode
         COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/slurm/multinode.sh
                 $<TARGET_FILE:fsdp_train> $<TARGET_FILE:fsdp_prepare>)
set_tests_properties(slurm_multinode PROPERTIES LABELS "slurm" TIMEOUT 1200 RUN_SERIAL TRUE)
