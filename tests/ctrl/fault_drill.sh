#!/usr/bin/env bash
# Integration: scripts/fault-drill --quick (or DRILL, scripts/fault-drill-pd
# --quick). The drill itself asserts the goals for each row (detected within
# 1 s where there is a signal, recovered within 5 s of the return, 0 hung,
# 0 KV blocks or buffers leaked, 0 failed where replay or a room retry
# covers the fault) and exits 1 naming each goal missed.
#  - fault-drill: the two-node pipeline in two network namespaces (af_packet
#    on veth pairs) on the tiny model, 8 streaming clients whose every
#    answer must equal an undisturbed run's, and one fault at a time: 5%
#    loss, 5% duplication and 25% reordering on the wire for 5 s, the
#    stage-0 worker SIGKILLed and started again 1 s later, the same for the
#    stage-1 worker on node 2, node 1's dataplane SIGKILLed and started
#    again (it creates its region anew: ctrld and the worker attach the new
#    one). About 2 minutes on the 2-core development machine.
#  - fault-drill-pd: a prefill node and a decode node (two kvferry-ctrld, two
#    kvferry-dataplane over net_memif), the same load on the decode node;
#    the prefill node's dataplane SIGKILLed and started again 1 s later (the
#    decode node runs the rooms in flight again in fresh ones: none fails),
#    then the prefill node's ctrld the same way (the rooms it held fail with
#    an error to their clients, by issue #13's rule), then the decode node's
#    ctrld (its clients' streams break; the prefill node keeps no KV of its
#    rooms once the new session speaks). About 60 s.
#    With "fault-drill-pd --workers" each node's stages run in kvferry-worker
#    processes: the decode node's stage-1 worker killed (its requests run
#    again here, token for token), the prefill node's (its failed prompts are
#    computed on the decode node instead), the decode node's dataplane
#    killed (its chain and PD link move to the new region): none fails.
#    With "fault-drill-pd --workers --netns" and the faults netem,link-down
#    the two dataplanes talk over a veth pair between two namespaces: 5%
#    loss, duplication and 25% reordering for 5 s, then the prefill node's
#    veth end down for 5 s: every room lands, none fails.
#   fault_drill.sh BUILD_DIR SOURCE_ROOT [DRILL [FLAGS [FAULTS]]]
# Root, hugepages and (fault-drill) network namespaces, else 77.
set -u
B=$(cd "$1" && pwd) S=$(cd "$2" && pwd) drill=${3:-fault-drill}
# shellcheck disable=SC2086 # FLAGS: words
"$S/scripts/$drill" --build "$B" --no-build --faults "${FAULT_DRILL_FAULTS:-${5:-quick}}" ${4:-}
rc=$?
[ $rc = 77 ] && exit 77
[ $rc = 0 ] && echo "PASS: every fault of the quick drill ($drill) within its goals"
exit $rc
