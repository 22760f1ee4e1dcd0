# slow_dsv3.cmake: make a dsv3-mini golden with zipf routing, then check it with the emulator
# (sampled and bitwise) and the oracle (sampled, within bounds). Fails on any non-zero exit.
execute_process(COMMAND ${GOLDEN} --preset dsv3-mini --routing zipf:1.2 --empty-slots 0.02 --seed 11 -o ${OUT}
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  file(REMOVE ${OUT})
  message(FATAL_ERROR "mok-golden failed: ${rc}")
endif()
foreach(backend emulate oracle)
  execute_process(COMMAND ${VERIFY} run ${OUT} --backend ${backend} --sample-tokens 48 --sample-cols 6 RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    file(REMOVE ${OUT})  # the 184 MB golden is not left in the build folder
    message(FATAL_ERROR "mok-verify run --backend ${backend} failed: ${rc}")
  endif()
endforeach()
file(REMOVE ${OUT})
