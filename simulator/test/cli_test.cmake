# CLI checks: --help exits 0, bad input exits 2 and writes nothing, two runs give the same bytes
# (and one run on one thread and on two),
# golden files (mok-golden v1) as workloads, the engine's rate quantum from a scenario.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
execute_process(COMMAND ${MOK_SIM} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0 OR NOT out MATCHES "What it models")
  message(FATAL_ERROR "--help failed (rc ${rc})")
endif()
file(WRITE ${WORK}/bad.json "{\"topology\": \"hgx-h200\", \"layer\": {\"hidden\": 7168}, \"protocol\": {\"dispatch\": \"push\"}}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/bad.json --out ${WORK}/bad_out RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "bad.json" OR EXISTS ${WORK}/bad_out)
  message(FATAL_ERROR "bad scenario: expected exit 2, a message naming the file and no output (rc ${rc}: ${err})")
endif()
execute_process(COMMAND ${MOK_SIM} run --set /protocol/comm_sms=0 RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "comm_sms")
  message(FATAL_ERROR "bad --set: expected exit 2 naming comm_sms (rc ${rc}: ${err})")
endif()
# Runs `mok-sim run ARGS_A` and `mok-sim run ARGS_B` (lists), each with --format json --per-gpu
# and a trace, and fails with WHAT unless both the JSON and the trace bytes agree.
function(expect_same_bytes tag what args_a args_b)
  foreach(i a b)
    execute_process(COMMAND ${MOK_SIM} run ${args_${i}} --format json --per-gpu --trace ${WORK}/${tag}_trace_${i}.json
                    OUTPUT_FILE ${WORK}/${tag}_run_${i}.json RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${tag} run ${i} failed (rc ${rc})")
    endif()
  endforeach()
  foreach(f run trace)
    # Both non-empty JSON (an empty output on both sides would otherwise compare equal).
    file(READ ${WORK}/${tag}_${f}_a.json text)
    string(JSON kind ERROR_VARIABLE jerr TYPE "${text}")
    if(jerr OR NOT kind STREQUAL "OBJECT")
      message(FATAL_ERROR "${tag}: the ${f} output is not a JSON object (${jerr})")
    endif()
    file(SHA256 ${WORK}/${tag}_${f}_a.json a)
    file(SHA256 ${WORK}/${tag}_${f}_b.json b)
    if(NOT a STREQUAL b)
      message(FATAL_ERROR "${what} (${f} bytes differ)")
    endif()
  endforeach()
endfunction()
set(small --set /layer/tokens_per_rank=512)
expect_same_bytes(seed "two runs with the same seed gave different bytes" "${small}" "${small}")
# A single run on one thread and on two (a rate quantum and 72 x 32 comm SMs: the helper thread
# applies the rate changes): the same bytes, trace included.
set(quantum --topology gb200-nvl72 ${small} --set /engine/rate_quantum_ns=2000 --threads)
expect_same_bytes(threads "a single run gave different bytes on one thread and on two" "${quantum};1" "${quantum};2")
execute_process(COMMAND ${MOK_SIM} run ${SRC}/scenarios/smoke_sweep.json --out ${WORK}/sweep RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/sweep/runs.csv OR NOT EXISTS ${WORK}/sweep/smoke.svg)
  message(FATAL_ERROR "sweep scenario failed (rc ${rc})")
endif()
# smoke_sweep.json: 2 directions x 2 exponents x 2 trials = 8 runs, one row each, and a plot.
file(STRINGS ${WORK}/sweep/runs.csv lines)
list(LENGTH lines n)
file(READ ${WORK}/sweep/smoke.svg svg)
if(NOT n EQUAL 9 OR NOT svg MATCHES "<svg" OR NOT svg MATCHES "polyline")
  message(FATAL_ERROR "sweep scenario: expected a header and 8 rows in runs.csv (got ${n} lines) and a plot with lines")
endif()

# Golden workload: the layer and the routing come from the shipped fixture.
foreach(i 1 2)
  execute_process(COMMAND ${MOK_SIM} run --golden ${FIXTURES}/small-zipf.h5 --format json
                  OUTPUT_FILE ${WORK}/golden${i}.json RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "--golden small-zipf.h5 failed (rc ${rc}: ${err})")
  endif()
endforeach()
file(READ ${WORK}/golden1.json g)
string(JSON ranks GET "${g}" layer num_ranks)
string(JSON hidden GET "${g}" layer hidden)
string(JSON kind GET "${g}" workload kind)
string(JSON chunks GET "${g}" result dispatch num_chunks)
if(NOT ranks EQUAL 4 OR NOT hidden EQUAL 128 OR NOT kind STREQUAL "golden" OR chunks LESS 1)
  message(FATAL_ERROR "golden run: expected R=4, H=128 from small-zipf.h5 (got R=${ranks}, H=${hidden}, ${kind}, ${chunks} chunks)")
endif()
file(SHA256 ${WORK}/golden1.json a)
file(SHA256 ${WORK}/golden2.json b)
if(NOT a STREQUAL b)
  message(FATAL_ERROR "two golden runs gave different bytes")
endif()
# The same from a scenario, swept over push and pull, with a rate quantum.
file(WRITE ${WORK}/golden_sweep.json "{\"topology\": \"hgx-h200\", \"engine\": {\"rate_quantum_ns\": 500},
  \"workload\": {\"kind\": \"golden\", \"file\": \"${FIXTURES}/small-zipf.h5\"},
  \"sweep\": [{\"path\": \"/protocol/dispatch\", \"values\": [\"push\", \"pull\"]}]}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/golden_sweep.json --out ${WORK}/golden_sweep RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/golden_sweep/runs.csv)
  message(FATAL_ERROR "golden sweep failed (rc ${rc}: ${err})")
endif()
file(STRINGS ${WORK}/golden_sweep/runs.csv lines)
list(LENGTH lines n)
if(NOT n EQUAL 3)
  message(FATAL_ERROR "golden sweep: expected a header and 2 rows in runs.csv, got ${n} lines")
endif()
# A golden scenario that also gives a layer, and a file that is not a golden: exit 2, named.
file(WRITE ${WORK}/golden_layer.json "{\"topology\": \"hgx-h200\", \"layer\": {\"hidden\": 128},
  \"workload\": {\"kind\": \"golden\", \"file\": \"${FIXTURES}/small-zipf.h5\"}}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/golden_layer.json RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "fixes the layer; remove \"layer\"")
  message(FATAL_ERROR "golden + layer: expected exit 2 naming the layer (rc ${rc}: ${err})")
endif()
execute_process(COMMAND ${MOK_SIM} run --golden ${WORK}/bad.json RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "bad.json")
  message(FATAL_ERROR "not a golden file: expected exit 2 naming the file (rc ${rc}: ${err})")
endif()
# A scenario's golden file that cannot be read: the message names the scenario, the field and
# where a relative path was looked for.
file(WRITE ${WORK}/golden_missing.json "{\"topology\": \"hgx-h200\", \"workload\": {\"kind\": \"golden\", \"file\": \"no/such.h5\"}}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/golden_missing.json RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "golden_missing.json: /workload/file 'no/such.h5': .*relative path is read from the current folder")
  message(FATAL_ERROR "missing golden in a scenario: expected exit 2 naming the scenario and field (rc ${rc}: ${err})")
endif()
# A routing file given without its kind runs the kind it has (uniform), and says so on stderr.
execute_process(COMMAND ${MOK_SIM} run --set "/workload/topk_file=\"unused.bin\"" RESULT_VARIABLE rc
                ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES "/workload/topk_file is set but /workload/kind is \"uniform\", so it is not used")
  message(FATAL_ERROR "topk_file without its kind: expected exit 0 and a note on stderr (rc ${rc}: ${err})")
endif()
execute_process(COMMAND ${MOK_SIM} run --set /engine/rate_quantum_ns=-1 RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR NOT err MATCHES "rate_quantum_ns")
  message(FATAL_ERROR "bad engine.rate_quantum_ns: expected exit 2 naming it (rc ${rc}: ${err})")
endif()

# Bad input found by review (2026-12-05): each exits 2 with a message naming the field, before
# any run, and writes nothing.
function(expect_bad tag pattern)
  execute_process(COMMAND ${MOK_SIM} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${pattern}")
    message(FATAL_ERROR "${tag}: expected exit 2 and a message matching '${pattern}' (rc ${rc}: ${err})")
  endif()
endfunction()
expect_bad(name_type "\"name\" must be a string" run --set /name=5)
# A misspelt flag before a value is named as such (not taken for a missing scenario file 'json').
expect_bad(misspelt_flag "not expected: --fromat" run --fromat json)
expect_bad(missing_scenario "scenario '.*/no_such_scenario.json' cannot be opened" run ${WORK}/no_such_scenario.json)
# (An empty argument does not survive expect_bad's ${ARGN}: run directly.)
execute_process(COMMAND ${MOK_SIM} run "" RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "the scenario path is empty")
  message(FATAL_ERROR "empty scenario path: expected exit 2 and 'the scenario path is empty' (rc ${rc}: ${err})")
endif()
expect_bad(kind_type "workload.kind must be one of" run --set /workload/kind=3)
expect_bad(sweep_through_string "/sweep/0/path '/topology/overrides/x' cannot be set"
           run --set "/sweep=[{\"path\":\"/topology/overrides/x\",\"values\":[1,2]}]")
expect_bad(sweep_root "must name a field below the top" run --set "/sweep=[{\"path\":\"\",\"values\":[1,2]}]")
expect_bad(zero_window "sm_store_inflight_bytes' = 0 is out of range"
           run --set "/topology={\"preset\":\"hgx-h200\",\"overrides\":{\"gpu.sm_store_inflight_bytes\":0}}")
expect_bad(comm_sms_named "with --set /protocol/comm_sms=132: protocol.comm_sms = 132 leaves no SM" run --set /protocol/comm_sms=132)
expect_bad(hot_beyond_experts "num_hot = 100 exceeds the layer's 16 experts"
           run --set /layer/experts_per_rank=2 --set "/workload={\"kind\":\"hot\",\"num_hot\":100}")
expect_bad(golden_fixes_layer "a golden workload fixes the layer" run --golden ${FIXTURES}/small-zipf.h5 --set /layer/top_k=1)
expect_bad(sweep_json "--format json prints one run's result" run ${SRC}/scenarios/smoke_sweep.json --format json)
expect_bad(overflow "\\(default scenario\\) with --set /layer/hidden=16777216.*: layer: the expert GEMMs could take over 1e17 ns" run --set "/layer/hidden=16777216" --set "/layer/intermediate=16777216"
           --set "/topology={\"preset\":\"hgx-h200\",\"overrides\":{\"gpu.bf16_dense_tflops\":1,\"gpu.gemm_efficiency\":0.01}}")
expect_bad(unknown_command "unknown command 'bogus'" bogus)
# A plot naming no metric is refused before the sweep runs: no --out directory appears.
expect_bad(plot_metric "plot y 'nope' is not a metric" run ${SRC}/scenarios/smoke_sweep.json --out ${WORK}/plot_out
           --set /plots/0/y=nope)
expect_bad(plot_key "plot key 'serie' is unknown" run ${SRC}/scenarios/smoke_sweep.json --out ${WORK}/plot_out
           --set /plots/0/serie=x)
if(EXISTS ${WORK}/plot_out)
  message(FATAL_ERROR "a refused plot left ${WORK}/plot_out behind")
endif()
# Output paths: a directory as --trace, a file in --out's way (no trace written either), and a
# trace through a symbolic link (the link stays, its target gets the trace).
set(tiny --set /layer/tokens_per_rank=64)
file(MAKE_DIRECTORY ${WORK}/trace_dir)
expect_bad(trace_dir "--trace '.*trace_dir' is a directory" run ${tiny} --trace ${WORK}/trace_dir)
file(WRITE ${WORK}/in_the_way "x")
expect_bad(out_blocked "--out '.*in_the_way/x': '.*in_the_way' is not a directory"
           run ${tiny} --trace ${WORK}/blocked_trace.json --out ${WORK}/in_the_way/x)
if(EXISTS ${WORK}/blocked_trace.json)
  message(FATAL_ERROR "a refused --out left the trace ${WORK}/blocked_trace.json behind")
endif()
file(CREATE_LINK linked_target.json ${WORK}/trace_link.json SYMBOLIC)
execute_process(COMMAND ${MOK_SIM} run ${tiny} --trace ${WORK}/trace_link.json RESULT_VARIABLE rc OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT IS_SYMLINK ${WORK}/trace_link.json OR NOT EXISTS ${WORK}/linked_target.json)
  message(FATAL_ERROR "--trace through a link: expected the link kept and its target written (rc ${rc})")
endif()

# A topology file with a field left out: exit 2 naming the file and the field (not a silent
# default), while --topology with a preset and overrides keeps working.
file(READ ${SRC}/topologies/hgx-h200.json topo_text)
string(JSON topo_text REMOVE "${topo_text}" scale_up nvlink_latency_ns)
file(WRITE ${WORK}/topo_missing.json "${topo_text}")
expect_bad(topology_missing_field "topo_missing.json: missing field 'scale_up.nvlink_latency_ns'"
           run --topology ${WORK}/topo_missing.json ${tiny})

# All or none at commit time (audit 2026-12-05): the run succeeds, then a device output fails
# (--trace /dev/full). The result file --out would get must not be left behind, neither in a
# folder made for it nor in one that existed (the checks above fail before any output exists,
# so they cannot catch a rollback that misses). A failed write to standard output is an error
# too, not exit 0.
if(EXISTS /dev/full)
  expect_bad(trace_full_new_out "--trace '/dev/full': cannot write to it" run ${tiny} --trace /dev/full --out ${WORK}/full_out)
  if(EXISTS ${WORK}/full_out)
    message(FATAL_ERROR "--trace /dev/full left ${WORK}/full_out behind")
  endif()
  file(MAKE_DIRECTORY ${WORK}/full_out_existing)
  expect_bad(trace_full_existing_out "--trace '/dev/full': cannot write to it"
             run ${tiny} --trace /dev/full --out ${WORK}/full_out_existing)
  file(GLOB left ${WORK}/full_out_existing/*)
  if(left)
    message(FATAL_ERROR "--trace /dev/full left files in an existing --out: ${left}")
  endif()
  function(expect_stdout_full tag pattern)
    execute_process(COMMAND ${MOK_SIM} ${ARGN} RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_FILE /dev/full)
    if(NOT rc EQUAL 2 OR NOT err MATCHES "${pattern}")
      message(FATAL_ERROR "${tag}: standard output full: expected exit 2 and '${pattern}' (rc ${rc}: ${err})")
    endif()
  endfunction()
  expect_stdout_full(stdout_single "cannot write the result to standard output" run ${tiny})
  expect_stdout_full(stdout_sweep "cannot write the result to standard output"
                     run ${SRC}/scenarios/smoke_sweep.json --set /plots=[] --threads 1)
  expect_stdout_full(stdout_trace "cannot write --trace '/dev/stdout' to standard output"
                     run ${tiny} --format json --trace /dev/stdout)
  expect_stdout_full(stdout_example "cannot write the example scenario to standard output" example)
  # A sweep with --out prints a summary line: when it cannot, the files are not left either.
  expect_stdout_full(stdout_sweep_out "cannot write the summary line"
                     run ${SRC}/scenarios/smoke_sweep.json --threads 1 --out ${WORK}/sweep_full_out)
  if(EXISTS ${WORK}/sweep_full_out)
    message(FATAL_ERROR "a sweep whose summary line could not be printed left ${WORK}/sweep_full_out behind")
  endif()
  # The trace file is not left behind when the result cannot be printed.
  expect_stdout_full(stdout_with_trace "cannot write the result" run ${tiny} --trace ${WORK}/stdout_full_trace.json)
  if(EXISTS ${WORK}/stdout_full_trace.json)
    message(FATAL_ERROR "a failed standard output left the trace ${WORK}/stdout_full_trace.json behind")
  endif()
endif()

# A pipe whose reader has gone (`mok-sim example | head -1`): exit 2 and one line, not death by
# SIGPIPE without a word (exit 141; found by review, 2026-12-07: only mok-verify ignored SIGPIPE).
# tools/expect_exit.sh's expect_closed_pipe runs each with SIGPIPE at its default.
foreach(args "example" "topology;list" "run;${tiny}" "--help")
  execute_process(COMMAND bash -c "source \"$0\"; expect_closed_pipe \"$@\"; exit $expect_failed"
                          ${SRC}/../tools/expect_exit.sh ${MOK_SIM} ${args}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "standard output a closed pipe: ${out}")
  endif()
endforeach()

# An exception other than mok::Error (here std::bad_alloc under a 3 GB address-space limit) is
# reported and exits 1 (a failure while running), not an abort (exit 134).
execute_process(COMMAND sh -c "ulimit -v 3000000 && exec \"$0\" run --set /layer/tokens_per_rank=16777216" ${MOK_SIM}
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(err MATCHES "Sanitizer")
  message(STATUS "out-of-memory check skipped: a sanitizer build cannot start under ulimit -v")
elseif(NOT rc EQUAL 1 OR NOT err MATCHES "out of memory while running")
  message(FATAL_ERROR "out of memory: expected exit 1 and 'out of memory while running' (rc ${rc}: ${err})")
endif()

# Sweeps (audit 2026-12-05): two axes on one path mislabelled the runs; golden as a sweep value
# exited 3 with a message about the CLI. Both are bad input (exit 2) naming the sweep entry.
expect_bad(sweep_duplicate_path "/sweep/1/path '/protocol/dispatch' repeats /sweep/0/path"
           run ${tiny} --set "/sweep=[{\"path\":\"/protocol/dispatch\",\"values\":[\"push\",\"pull\"]},{\"path\":\"/protocol/dispatch\",\"values\":[\"pull\"]}]")
expect_bad(sweep_golden_value "/sweep/0/values: golden cannot be a sweep value"
           run ${tiny} --set /workload/file=${FIXTURES}/small-zipf.h5
           --set "/sweep=[{\"path\":\"/workload/kind\",\"values\":[\"uniform\",\"golden\"]}]")
expect_bad(sweep_workload_of_golden "/sweep/0/path '/workload/kind' changes the workload, but a golden workload"
           run --golden ${FIXTURES}/small-zipf.h5 --set "/sweep=[{\"path\":\"/workload/kind\",\"values\":[\"uniform\"]}]")

# Empty output paths are refused like --topology '' (they were silently ignored).
# (Direct calls: a function's ARGN drops empty arguments.)
foreach(flag trace out)
  execute_process(COMMAND ${MOK_SIM} run ${tiny} --${flag} "" RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "--${flag} is empty")
    message(FATAL_ERROR "--${flag} '': expected exit 2 and '--${flag} is empty' (rc ${rc}: ${err})")
  endif()
endforeach()
# Two plots writing one SVG: refused before any run (no --out folder appears), naming the entry.
expect_bad(plot_same_file "/plots/1/file 'smoke.svg' is also /plots/0/file" run ${SRC}/scenarios/smoke_sweep.json
           --out ${WORK}/plot_same_out --set "/plots/1={\"file\":\"smoke.svg\",\"x\":\"/workload/exponent\",\"y\":\"layer_us\",\"series\":\"/protocol/dispatch\"}")
if(EXISTS ${WORK}/plot_same_out)
  message(FATAL_ERROR "two plots on one file left ${WORK}/plot_same_out behind")
endif()

# Communication past int64 nanoseconds (a 1-byte window over a 10 ms latency, 16 GiB pieces):
# refused as bad input with the reason and the file, not an "internal ... please report" (exit 1).
file(WRITE ${WORK}/comm_overflow.json "{\"topology\": {\"preset\": \"hgx-h200\", \"overrides\": {
  \"gpu.sm_store_inflight_bytes\": 1, \"gpu.sm_load_inflight_bytes\": 1, \"gpu.sm_tma_load_inflight_bytes\": 1,
  \"scale_up.nvlink_latency_ns\": 10000000, \"gpu.bf16_dense_tflops\": 1000000, \"gpu.gemm_efficiency\": 1}},
  \"layer\": {\"hidden\": 16777216, \"intermediate\": 16, \"shared_intermediate\": 0, \"experts_per_rank\": 1,
            \"top_k\": 1, \"tokens_per_rank\": 4096},
  \"protocol\": {\"comm_sms\": 1, \"chunk_tokens\": 4096}}")
expect_bad(comm_overflow "comm_overflow.json: layer: a transfer of [0-9]+ bytes at .* GB/s would take over 1e17 ns"
           run ${WORK}/comm_overflow.json)

# Errors that named neither the file nor the fix (audit 2026-12-05, item 8).
file(WRITE ${WORK}/array.json "[1, 2]")
expect_bad(scenario_not_object "array.json: a scenario must be a JSON object" run ${WORK}/array.json --topology hgx-h200)
expect_bad(set_through_number "--set '/layer/tokens_per_rank/x=3': .*; the pointer must lead through objects"
           run --set /layer/tokens_per_rank/x=3)

# Audit of the forty-third session (2026-12-06): each exits 2 naming the file and the field.
expect_bad(topology_directory "topology file '.*' is a directory; give a JSON file" run --topology ${WORK}/)
expect_bad(topology_show_directory "topology file '.*' is a directory" topology show ${WORK}/)
file(WRITE ${WORK}/overflow.json "{\"topology\": {\"preset\": \"hgx-h200\", \"overrides\": {\"scale_up.nvlink_gbps\": 1e999}},
  \"layer\": {\"hidden\": 1024, \"intermediate\": 512, \"shared_intermediate\": 0, \"experts_per_rank\": 4,
            \"top_k\": 2, \"tokens_per_rank\": 64}}")
expect_bad(number_overflow "scenario '.*overflow.json' holds a number out of range" run ${WORK}/overflow.json)
file(WRITE ${WORK}/bad_preset.json "{\"topology\": \"hgx-h300\", \"layer\": {\"hidden\": 1024, \"intermediate\": 512,
  \"shared_intermediate\": 0, \"experts_per_rank\": 4, \"top_k\": 2, \"tokens_per_rank\": 64}}")
expect_bad(preset_named "bad_preset.json: topology: unknown topology preset 'hgx-h300'" run ${WORK}/bad_preset.json)
expect_bad(preset_in_sweep "\\[/topology=\"nope\"\\]: topology: unknown topology preset 'nope'"
           run ${tiny} --set "/sweep=[{\"path\":\"/topology\",\"values\":[\"hgx-h200\",\"nope\"]}]")
expect_bad(first_point_named "\\[/protocol/chunk_tokens=\"a\"\\]: protocol.chunk_tokens must be an integer"
           run ${tiny} --set "/sweep=[{\"path\":\"/protocol/chunk_tokens\",\"values\":[\"a\",32]}]")
expect_bad(plots_single_run "\"plots\" needs a sweep or trials > 1"
           run ${tiny} --set "/plots=[{\"file\":\"x.svg\",\"x\":\"/workload/exponent\",\"y\":\"layer_us\"}]")
expect_bad(plots_not_list "\"plots\" must be a list" run ${tiny} --set /plots=7)
expect_bad(too_many_gpus "the topology has 32768 GPUs and layer.num_ranks defaults to all of them, but a layer has at most 4096"
           run ${tiny} --set "/topology={\"preset\":\"hgx-h200\",\"overrides\":{\"scale_out.num_domains\":4096}}")
# A single run with --out writes result.txt and says so on standard output; a standard output
# that cannot take that line leaves no file (and no folder made for it).
execute_process(COMMAND ${MOK_SIM} run --out ${WORK}/single_out RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT out STREQUAL "wrote ${WORK}/single_out/result.txt\n" OR NOT EXISTS ${WORK}/single_out/result.txt)
  message(FATAL_ERROR "single run --out: expected 'wrote .../result.txt' and the file (rc ${rc}: ${out}${err})")
endif()
execute_process(COMMAND ${MOK_SIM} run --out ${WORK}/single_full OUTPUT_FILE /dev/full RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 2 OR EXISTS ${WORK}/single_full)
  message(FATAL_ERROR "single run --out, standard output full: expected exit 2 and no ${WORK}/single_full (rc ${rc}: ${err})")
endif()
file(MAKE_DIRECTORY ${WORK}/out_dir_file/result.txt)
expect_bad(out_file_directory "--out '.*out_dir_file': '.*result.txt', a file it writes, is a directory"
           run ${tiny} --out ${WORK}/out_dir_file)
# A layer whose GEMMs overflow int64 ns is refused before its workload (1.7e9 slots at 72 GPUs,
# which would take minutes and tens of GB to draw): well inside the timeout.
execute_process(COMMAND ${MOK_SIM} run --topology gb200-nvl72 --set /layer/hidden=16777216
                        --set /layer/intermediate=16777216 --set /layer/tokens_per_rank=3000000
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET TIMEOUT 30)
if(NOT rc EQUAL 2 OR NOT err MATCHES "expert GEMMs could take over 1e17 ns")
  message(FATAL_ERROR "huge layer: expected exit 2 at once, before the workload (rc ${rc}: ${err})")
endif()
# Unknown subcommands are named; a help that cannot be written is an error.
expect_bad(unknown_subcommand "'--bogus' is not a subcommand of mok-sim; give one of: run, topology, example" --bogus)
expect_bad(unknown_nested_subcommand "'bogus' is not a subcommand of topology; give one of: list, show" topology bogus)
if(EXISTS /dev/full)
  execute_process(COMMAND ${MOK_SIM} --help OUTPUT_FILE /dev/full RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "cannot write the help")
    message(FATAL_ERROR "--help > /dev/full: expected exit 2 and a message (rc ${rc}: ${err})")
  endif()
endif()

# Found by the forty-ninth session's audit; each failed before its fix.
# (1) A plot whose x values are closer than a tick step can move a double (0.3 and the next double
# up; seeds near 2^60): ticks are computed from their index, so the plot is written (the old
# loop never ended and grew without bound).
file(WRITE ${WORK}/close_x.json "{\"topology\":\"hgx-h200\",\"layer\":{\"hidden\":256,\"intermediate\":128,\"experts_per_rank\":2,\"top_k\":2,\"tokens_per_rank\":64},
 \"sweep\":[{\"path\":\"/workload/exponent\",\"values\":[0.3,0.30000000000000004]}],
 \"plots\":[{\"file\":\"p.svg\",\"x\":\"/workload/exponent\",\"y\":\"layer_us\"}]}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/close_x.json --out ${WORK}/close_x_out RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/close_x_out/p.svg)
  message(FATAL_ERROR "a plot of x values one double apart: expected the plot written (rc ${rc}: ${err})")
endif()
file(READ ${WORK}/close_x_out/p.svg svg)
if(NOT svg MATCHES "</svg>" OR svg MATCHES "nan|inf")
  message(FATAL_ERROR "a plot of x values one double apart: the SVG is incomplete or holds nan/inf")
endif()
# Four doubles apart near 1.9 the tick index passes 2^53, where ++k stopped moving (review).
file(READ ${WORK}/close_x.json close_x)
string(REPLACE "[0.3,0.30000000000000004]" "[1.9,1.9000000000000008]" close_x "${close_x}")
file(WRITE ${WORK}/close_x2.json "${close_x}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/close_x2.json --out ${WORK}/close_x2_out RESULT_VARIABLE rc OUTPUT_QUIET
                ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/close_x2_out/p.svg)
  message(FATAL_ERROR "a plot of x values four doubles apart near 1.9: expected the plot written (rc ${rc}: ${err})")
endif()
# (2) --topology replaces a scenario's preset but keeps its overrides (it used to drop them):
# slow ports through the override must still be slow.
file(WRITE ${WORK}/with_override.json "{\"topology\":{\"preset\":\"hgx-h100\",\"overrides\":{\"scale_up.nvlink_gbps\":50}},
 \"layer\":{\"hidden\":1024,\"intermediate\":512,\"experts_per_rank\":4,\"top_k\":4,\"tokens_per_rank\":256}}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/with_override.json --topology hgx-h200 --format csv
                RESULT_VARIABLE rc OUTPUT_VARIABLE cli_topo ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT err MATCHES "--topology hgx-h200 replaces the scenario's topology preset; its 1 override")
  message(FATAL_ERROR "--topology over a preset with overrides: expected a run and a note (rc ${rc}: ${err})")
endif()
file(WRITE ${WORK}/with_override_h200.json "{\"topology\":{\"preset\":\"hgx-h200\",\"overrides\":{\"scale_up.nvlink_gbps\":50}},
 \"layer\":{\"hidden\":1024,\"intermediate\":512,\"experts_per_rank\":4,\"top_k\":4,\"tokens_per_rank\":256}}")
execute_process(COMMAND ${MOK_SIM} run ${WORK}/with_override_h200.json --format csv RESULT_VARIABLE rc OUTPUT_VARIABLE file_topo)
if(NOT rc EQUAL 0 OR NOT cli_topo STREQUAL file_topo)
  message(FATAL_ERROR "--topology hgx-h200 over {hgx-h100, overrides} should equal {hgx-h200, overrides}:\n${cli_topo}\n${file_topo}")
endif()
# (3) Simulated time past int64 (each transfer under 1e17 ns, their sum not): exit 2, not a
# wrapped clock with exit 0.
expect_bad(clock_past_horizon "simulated time reached [0-9]+ ns, past the 1e18 ns"
           run --set "/topology={\"preset\":\"hgx-h200\",\"overrides\":{\"scale_up.gpus_per_domain\":200,\"gpu.sm_store_inflight_bytes\":1,\"scale_up.nvlink_latency_ns\":10000000}}"
           --set "/layer={\"hidden\":16777216,\"intermediate\":16,\"experts_per_rank\":1,\"top_k\":8,\"tokens_per_rank\":2250}"
           --set "/protocol={\"dispatch\":\"push\",\"phases\":\"dispatch\",\"signaling\":\"flag_in_data\",\"comm_sms\":1,\"chunk_tokens\":4096}")
# (4) An SM rate share below half a rate unit (a 1-byte window over 10 ms, split across 8 row-order
# destinations) is one unit, not 0: the layer ends (it used to stop with "internal: ...
# undelivered dispatch data").
execute_process(COMMAND ${MOK_SIM} run --format csv
                --set "/topology={\"preset\":\"hgx-h200\",\"overrides\":{\"scale_up.gpus_per_domain\":64,\"gpu.sm_store_inflight_bytes\":1,\"scale_up.nvlink_latency_ns\":10000000}}"
                --set "/layer={\"hidden\":16,\"intermediate\":16,\"experts_per_rank\":1,\"top_k\":8,\"tokens_per_rank\":64}"
                --set "/protocol={\"dispatch\":\"push\",\"push_order\":\"row_order\",\"phases\":\"dispatch\",\"signaling\":\"flag_in_data\",\"comm_sms\":1,\"chunk_tokens\":64}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a sub-unit SM rate share: expected the layer to finish (rc ${rc}: ${err})")
endif()
# (8) A phase the run leaves out is an empty CSV cell, not a measured 0 (JSON leaves it out).
# Columns: layer_us, 8 dispatch, 8 combine, compute_max_us, 4 load statistics.
if(NOT out MATCHES "\n[^,\n]+(,[^,\n]+)(,[^,\n]+)(,[^,\n]+)(,[^,\n]+)(,[^,\n]+)(,[^,\n]+)(,[^,\n]+)(,[^,\n]+),,,,,,,,,,[^,\n]+")
  message(FATAL_ERROR "dispatch-only run: combine_us and compute_max_us should be empty cells: ${out}")
endif()
# (5) A key given twice in one object (the later value used to win in silence).
file(WRITE ${WORK}/dup_key.json "{\"topology\":\"hgx-h200\",\"protocol\":{\"dispatch\":\"push\"},\"protocol\":{\"combine\":\"pull\"}}")
expect_bad(duplicate_key "dup_key.json': the top level has \"protocol\" twice" run ${WORK}/dup_key.json)
file(WRITE ${WORK}/dup_key_deep.json "{\"topology\":\"hgx-h200\",\"sweep\":[{\"path\":\"/protocol/dispatch\",\"values\":[\"push\"]},{\"path\":\"/workload/exponent\",\"values\":[1],\"values\":[2]}]}")
expect_bad(duplicate_key_deep "/sweep/1 has \"values\" twice" run ${WORK}/dup_key_deep.json)
# (6) A sweep whose axes multiply past the limit is refused before any point is built.
set(values "[1,2,3,4,5,6,7,8,9,10]")
set(axes "")
foreach(p dispatch_dtype gemm_tile_rows chunk_tokens comm_sms poll_interval_ns signal_threads)
  string(APPEND axes "{\"path\":\"/protocol/${p}\",\"values\":${values}},")
endforeach()
expect_bad(sweep_too_big "the sweep's axes multiply to more than 100000 points \\(by /sweep/5, 100000 x 10\\)"
           run --set "/sweep=[${axes}{\"path\":\"/workload/exponent\",\"values\":[1]}]")
# (7) A fractional nanosecond field (the engine's clock counts whole ns).
expect_bad(fractional_ns "'scale_up.nvlink_latency_ns' = 700.5 must be a whole number of ns"
           run --set "/topology={\"preset\":\"hgx-h200\",\"overrides\":{\"scale_up.nvlink_latency_ns\":700.5}}")
# (9) A phase that moves nothing (every slot empty) has its data in place at its start, not at 0
# before it.
execute_process(COMMAND ${MOK_SIM} run ${tiny} --set "/workload={\"kind\":\"uniform\",\"empty_slot_fraction\":1}"
                --set /protocol/signaling=barrier --format json RESULT_VARIABLE rc OUTPUT_VARIABLE out)
string(JSON c_start GET "${out}" result combine start_ns)
string(JSON c_data GET "${out}" result combine data_end_ns)
if(NOT rc EQUAL 0 OR c_start LESS_EQUAL 0 OR NOT c_data EQUAL c_start)
  message(FATAL_ERROR "empty combine: expected data_end_ns = start_ns > 0 (rc ${rc}: ${c_data} against ${c_start})")
endif()
# Found by an audit (fiftieth session):
# (10) A --set on a field the sweep varies was overwritten at every point, in silence.
expect_bad(set_on_swept_field "--set '/protocol/dispatch=push': /sweep/0/path '/protocol/dispatch' sweeps this field"
           run ${SRC}/scenarios/smoke_sweep.json --set /protocol/dispatch=push --out ${WORK}/swept_set)
# ... and on an object above it whose value gives that field.
expect_bad(set_above_swept_field "/sweep/0/path '/protocol/dispatch' sweeps this field"
           run ${SRC}/scenarios/smoke_sweep.json "--set=/protocol={\"dispatch\":\"push\",\"phases\":\"dispatch\"}"
           --out ${WORK}/swept_parent)
# (11) A plot over a sweep with a third axis averaged that axis's runs into one line.
expect_bad(plot_averages_an_axis "the sweep also varies /protocol/dispatch, which is neither its x nor a series"
           run ${SRC}/scenarios/smoke_sweep.json --set "/plots=[{\"file\":\"p.svg\",\"x\":\"/workload/exponent\",\"y\":\"dispatch_nvlink_util\"}]"
           --out ${WORK}/plot_avg)
# (12) Trials with routing from a file repeated one run (and listed seeds never used).
expect_bad(trials_fixed_routing "trials 3 would repeat one run: a golden workload fixes the routing"
           run --golden ${FIXTURES}/small-zipf.h5 --set /trials=3 --out ${WORK}/golden_trials)
# (13) A negative (or zero) experts_per_rank was taken as not given.
expect_bad(experts_per_rank_negative "layer.experts_per_rank must be at least 1"
           run --set /layer/experts_per_rank=-3 --set /layer/num_experts=256)
# (14) A --set value may not repeat a key either (a file may not).
expect_bad(set_duplicate_key "--set '/protocol=.*': /protocol has \"dispatch\" twice"
           run --set "/protocol={\"dispatch\":\"push\",\"dispatch\":\"pull\"}")
# (15) Nesting past 64 levels (memory grew with its square; 200,000 levels ran out of memory, exit 1).
string(REPEAT "[" 100 deep_open)
string(REPEAT "]" 100 deep_close)
file(WRITE ${WORK}/deep.json "${deep_open}${deep_close}")
expect_bad(json_too_deep "nests objects and arrays more than 64 deep" run ${WORK}/deep.json)
# ... and 64 levels are still JSON the parser takes (refused after, as a scenario that is not an object).
string(REPEAT "[" 64 deep_open)
string(REPEAT "]" 64 deep_close)
file(WRITE ${WORK}/deep64.json "${deep_open}${deep_close}")
expect_bad(json_64_deep "a scenario must be a JSON object" run ${WORK}/deep64.json)
# A plot over a sweep whose third axis has one value averages nothing: accepted.
execute_process(COMMAND ${MOK_SIM} run ${SRC}/scenarios/smoke_sweep.json --set /trials=1 "--set=/sweep/0/values=[\"push\"]"
                "--set=/plots=[{\"file\":\"p.svg\",\"x\":\"/workload/exponent\",\"y\":\"dispatch_nvlink_util\"}]"
                --out ${WORK}/plot_one_value RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/plot_one_value/p.svg)
  message(FATAL_ERROR "a plot over a one-value third axis: expected exit 0 and p.svg (rc ${rc}: ${err})")
endif()
# (16) Options that would change nothing were dropped unseen.
expect_bad(trace_gpus_alone "--trace-gpus chooses the GPUs of the Chrome trace: give --trace FILE too" run --trace-gpus 4)
expect_bad(per_gpu_not_json "--per-gpu adds per-GPU timelines to a run's JSON: give --format json" run --per-gpu)
expect_bad(table_for_sweep "--format table prints one run's result" run ${SRC}/scenarios/smoke_sweep.json --format table)
# (17) A plot of a metric no run simulated (a dispatch-only sweep) drew an empty SVG with exit 0;
# then it was refused only after every run. Now before any: at 288 GPUs the four runs take seconds
# and print "runs done" progress, which a refusal before them never reaches.
expect_bad(plot_unsimulated "no run simulates combine_us .every point's /protocol/phases leaves its phase out"
           run ${SRC}/scenarios/smoke_sweep.json --set /trials=1
           --set "/plots=[{\"file\":\"c.svg\",\"x\":\"/workload/exponent\",\"y\":\"combine_us\",\"series\":\"/protocol/dispatch\"}]"
           --out ${WORK}/plot_unsimulated)
if(EXISTS ${WORK}/plot_unsimulated)
  message(FATAL_ERROR "plot_unsimulated: a refused run left ${WORK}/plot_unsimulated behind")
endif()
execute_process(COMMAND ${MOK_SIM} run ${SRC}/scenarios/smoke_sweep.json --set /trials=1
                "--set=/topology={\"preset\":\"multi-rack:4\"}" --set /layer/tokens_per_rank=8192
                "--set=/plots=[{\"file\":\"c.svg\",\"x\":\"/workload/exponent\",\"y\":\"compute_max_us\",\"series\":\"/protocol/dispatch\"}]"
                --out ${WORK}/plot_unsimulated_big RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET TIMEOUT 60)
if(NOT rc EQUAL 2 OR NOT err MATCHES "no run simulates compute_max_us" OR err MATCHES "runs done")
  message(FATAL_ERROR "plot_unsimulated_big: expected exit 2 before any run (rc ${rc}: ${err})")
endif()
# A sweep over /protocol/phases that simulates the metric in some points is accepted (the others' cells are empty).
execute_process(COMMAND ${MOK_SIM} run ${SRC}/scenarios/smoke_sweep.json --set /trials=1
                "--set=/sweep/0={\"path\":\"/protocol/phases\",\"values\":[\"dispatch\",\"combine\"]}"
                "--set=/plots=[{\"file\":\"c.svg\",\"x\":\"/workload/exponent\",\"y\":\"combine_us\",\"series\":\"/protocol/phases\"}]"
                --out ${WORK}/plot_some_simulated RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT EXISTS ${WORK}/plot_some_simulated/c.svg)
  message(FATAL_ERROR "plot_some_simulated: expected exit 0 and c.svg (rc ${rc}: ${err})")
endif()
