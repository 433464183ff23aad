#!/bin/sh
# Writes the packaged /etc/kvferry/kvferry.conf on stdout: ctrld's sections,
# then the worker's and the dataplane's, every key commented out at its
# default as each daemon's --print-config writes it (each daemon skips the
# others' sections), then how the units of one node read the file.
# debian/rules installs its output; tests/pkg/node_units.sh starts the
# units' command lines on it.
#   pkg/kvferry.conf.sh BUILD_DIR
set -eu
b=$1
# without KVFERRY_*: the build's environment must not show in the file
unset KVFERRY_CONFIG
"$b/kvferry-ctrld" --print-config
for d in kvferry-worker kvferry-dataplane; do
	echo
	"$b/$d" --print-config | sed -n '/^\[[a-z]*\]/,$p'
done
cat <<'EOF'

# --- One node under systemd (kvferry.target) ---------------------------------
#
# `systemctl start kvferry.target` starts kvferry-ctrld, and before it the
# units enabled into the target: kvferry-dataplane.service, then one
# kvferry-worker@K.service per pipeline stage K. With [engine] worker_region
# empty, ctrld runs every stage itself and needs nothing but [model]
# model_dir. With stages in worker processes, instance K reads [worker] and
# then [worker.K] (kvferry-worker --instance K): the keys every stage
# shares go in [worker], a stage's own (in, out, device, ...) in its
# section, and its role is stageK unless set. Two stages on one node
# without a dataplane, uncommented:
#
#   [engine]
#   stages = 2
#   worker_region = node
#   worker_region_size = 256M
#
#   [worker]
#   region = node
#   model = /var/lib/kvferry/model
#
#   [worker.0]
#   in = ring:serve.s0.in
#   out = ring:serve.s1.in
#
#   [worker.1]
#   in = ring:serve.s1.in
#   out = ring:serve.ret
#
# then: systemctl enable kvferry-worker@0 kvferry-worker@1 kvferry.target
#       systemctl start kvferry.target
# With a dataplane ([dp] port, region = node, region_size = 512), it creates
# the region instead: worker_region_size = 0, and enable kvferry-dataplane
# too. kvferry-setup(8) binds a NIC and reserves the hugepages.
EOF
