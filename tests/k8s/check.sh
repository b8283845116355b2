#!/usr/bin/env bash
# Renders both overlays (and the optional ServiceMonitor component), validates every object
# offline against the Kubernetes schema and dlcp's policy, and checks that dlcpd accepts the
# rendered ConfigMap and arguments. Usage: tests/k8s/check.sh DLCPD_BINARY WORK_DIR
set -euo pipefail
DLCPD=$1
WORK=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for tool in kubectl node npm; do
  command -v $tool >/dev/null || { echo "k8s check: $tool is not installed"; exit 1; }
done
mkdir -p "$WORK"
# kubernetes-models is fetched once into the build tree (npm registry), then used offline.
if [ ! -d "$WORK/node_modules/kubernetes-models" ]; then
  cp "$ROOT/tests/k8s/package.json" "$WORK/"
  (cd "$WORK" && npm install --no-audit --no-fund --loglevel=error >/dev/null)
fi
cp "$ROOT/tests/k8s/validate.js" "$WORK/"

rendered=()
for overlay in udp rdma; do
  kubectl kustomize "$ROOT/deploy/k8s/overlays/$overlay" > "$WORK/$overlay.yaml"
  rendered+=("$WORK/$overlay.yaml")
done
# The trainer examples (an Indexed Job and a Kubeflow PyTorchJob running the digits training).
kubectl kustomize "$ROOT/deploy/k8s/examples/trainer" > "$WORK/trainer.yaml"
rendered+=("$WORK/trainer.yaml")
for want in "kind: PyTorchJob" "completionMode: Indexed" "dlcp.io/trainer: \"true\"" "secretName: dlcp-trainer-tls" \
            "DLCP_AGGREGATORS_SERVICE: dlcpd.dlcp.svc"; do
  grep -qF "$want" "$WORK/trainer.yaml" || { echo "trainer examples lack: $want"; exit 1; }
done
# Host stages (docs/host-stage.md): dlcpd serves its default host socket in the node's /run/dlcp,
# and every trainer pod mounts that same directory.
for f in udp rdma trainer; do
  grep -qF "path: /run/dlcp" "$WORK/$f.yaml" && grep -qF "mountPath: /run/dlcp" "$WORK/$f.yaml" || {
    echo "$f: no hostPath /run/dlcp mounted at /run/dlcp, where the host socket is"; exit 1; }
done
defaults=$("$DLCPD" --dump-config 2>/dev/null || true)  # it may refuse the rest of an empty configuration
grep -q "host-socket=/run/dlcp/dlcpd.sock" <<<"$defaults" || {
  echo "dlcpd's default host socket is not in /run/dlcp, which the manifests share"; exit 1; }
# Every setting the trainer ConfigMap gives must be one the digits example reads.
for key in $(sed -n 's/^  \(DLCP_[A-Z_]*\):.*/\1/p' "$ROOT/deploy/k8s/examples/trainer/configmap.yaml"); do
  grep -q "env(\"$key\"" "$ROOT/client/python/dlcp/examples/digits.py" || {
    echo "the trainer ConfigMap sets $key, which dlcp.examples.digits does not read"; exit 1; }
done
# The optional component, applied on top of the udp overlay.
mkdir -p "$WORK/with-monitor"
rel=$(realpath --relative-to="$WORK/with-monitor" "$ROOT/deploy/k8s")  # kustomize wants relative paths
# An overlay sets the label its Prometheus selects ServiceMonitors by, as the component says.
cat > "$WORK/with-monitor/kustomization.yaml" <<KUST
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [$rel/overlays/udp]
components: [$rel/components/servicemonitor, $rel/components/cert-manager]
patches:
  - target: {kind: ServiceMonitor, name: dlcpd}
    patch: '[{"op": "add", "path": "/metadata/labels/release", "value": "monitoring"}]'
KUST
kubectl kustomize "$WORK/with-monitor" > "$WORK/with-monitor.yaml"
rendered+=("$WORK/with-monitor.yaml")
grep -q "kind: ServiceMonitor" "$WORK/with-monitor.yaml" || { echo "ServiceMonitor missing"; exit 1; }
grep -q "release: monitoring" "$WORK/with-monitor.yaml" || { echo "the ServiceMonitor's labels cannot be set"; exit 1; }
# The cert-manager component issues the Secrets the DaemonSet and the trainer examples mount.
for want in "secretName: dlcpd-tls" "secretName: dlcp-trainer-tls" "kind: Issuer" "isCA: true"; do
  grep -qF "$want" "$WORK/with-monitor.yaml" || { echo "the cert-manager component lacks: $want"; exit 1; }
done
# The data ports come from one setting: the policy admits DLCP_DATA_PORT and up, for any thread count.
data_port=$(sed -n 's/^ *DLCP_DATA_PORT: "\([0-9]*\)"/\1/p' "$WORK/udp.yaml")
threads=$(sed -n 's/^ *DLCP_DATA_THREADS: "\([0-9]*\)"/\1/p' "$WORK/udp.yaml")
policy=$(awk '/kind: NetworkPolicy/,0' "$WORK/udp.yaml")
grep -q "port: $data_port\$" <<<"$policy" || { echo "the NetworkPolicy does not admit DLCP_DATA_PORT $data_port"; exit 1; }
end_port=$(sed -n 's/^[ -]*endPort: \([0-9]*\)/\1/p' <<<"$policy")
(( end_port >= data_port + 63 && threads <= 64 )) || {
  echo "the NetworkPolicy's data ports $data_port-$end_port do not cover 64 data threads"; exit 1; }
if grep -q "containerPort: $((data_port + 1))" "$WORK/udp.yaml"; then
  echo "the DaemonSet lists data ports by hand; DLCP_DATA_PORT and DLCP_DATA_THREADS decide them"; exit 1
fi
grep -q "rdma/hca_shared_devices_a" "$WORK/rdma.yaml" || { echo "rdma overlay lacks the device resource"; exit 1; }
grep -q "IPC_LOCK" "$WORK/rdma.yaml" || { echo "rdma overlay lacks IPC_LOCK"; exit 1; }
for want in "priorityClassName: dlcp-aggregator" "kind: PriorityClass" "app.kubernetes.io/component: aggregator" \
            "app.kubernetes.io/version:" "app.kubernetes.io/managed-by: kustomize"; do
  grep -qF "$want" "$WORK/udp.yaml" || { echo "the aggregators' manifests lack: $want"; exit 1; }
done
# The memory limit derives from dlcpd's cap on accumulators (configmap.yaml says how), and every
# job's budget fits under that cap.
setting() { sed -n "s/^ *$1: \"\([0-9]*\)\"/\1/p" "$WORK/udp.yaml"; }
cap=$(setting DLCP_MAX_MEMORY_BYTES)
[ -n "$cap" ] || { echo "the ConfigMap sets no DLCP_MAX_MEMORY_BYTES: nothing caps dlcpd's memory"; exit 1; }
(( $(setting DLCP_MAX_JOB_BYTES) <= cap )) || { echo "DLCP_MAX_JOB_BYTES exceeds DLCP_MAX_MEMORY_BYTES"; exit 1; }
limit=$(awk '/kind: DaemonSet/,0' "$WORK/udp.yaml" | awk '/limits:/ { l = 1 } l && /memory:/ { print; exit }' |
  sed -n 's/^ *memory: \([0-9]*\)Gi$/\1/p')
need=$(( cap + (256 << 20) * $(setting DLCP_DATA_THREADS) + (1 << 30) ))
(( (limit << 30) >= need )) || { echo "the pod's memory limit ${limit}Gi is under dlcpd's need of $need bytes"; exit 1; }
# SIGTERM drains for up to DLCP_DRAIN_TIMEOUT_MS; the pod's grace period must cover it.
drain_ms=$(sed -n 's/^ *DLCP_DRAIN_TIMEOUT_MS: "\([0-9]*\)"/\1/p' "$WORK/udp.yaml")
grace_s=$(sed -n 's/^ *terminationGracePeriodSeconds: \([0-9]*\)/\1/p' "$WORK/udp.yaml" | head -1)
(( grace_s * 1000 > drain_ms )) || { echo "terminationGracePeriodSeconds $grace_s does not cover the drain (${drain_ms} ms)"; exit 1; }

(cd "$WORK" && node validate.js "${rendered[@]}")

# The policy must catch a bad workload: root, :latest, no probes, no limits, extra capabilities.
cat > "$WORK/bad.yaml" <<'BAD'
apiVersion: apps/v1
kind: Deployment
metadata: {name: bad}
spec:
  selector: {matchLabels: {a: b}}
  template:
    metadata: {labels: {a: b}}
    spec:
      containers:
        - name: c
          image: example/dlcpd:latest
          securityContext: {capabilities: {add: [NET_ADMIN]}}
BAD
if (cd "$WORK" && node validate.js bad.yaml > bad.out); then
  echo "policy check accepted a bad workload"; cat "$WORK/bad.out"; exit 1
fi
for want in readinessProbe livenessProbe "cpu limit" "not pinned" runAsNonRoot readOnlyRootFilesystem \
            allowPrivilegeEscalation "drop ALL" NET_ADMIN; do
  grep -q "$want" "$WORK/bad.out" || { echo "policy check missed: $want"; cat "$WORK/bad.out"; exit 1; }
done

# dlcpd must accept what the manifests give it: the ConfigMap as DLCP_* variables, and the args.
for overlay in udp rdma; do
  env_args=$(cd "$WORK" && node -e '
    const YAML = require("yaml"); const fs = require("fs");
    for (const d of YAML.parseAllDocuments(fs.readFileSync(process.argv[1], "utf8"))) {
      const o = d.toJS(); if (o && o.kind === "ConfigMap")
        for (const [k, v] of Object.entries(o.data)) console.log(`${k}=${v}`);
    }' "$WORK/$overlay.yaml")
  mapfile -t envs <<<"$env_args"
  if ! env -i "${envs[@]}" "$DLCPD" --advertise-host=10.0.0.1 --dump-config > "$WORK/$overlay.config" 2>&1; then
    echo "dlcpd refuses the $overlay overlay's configuration:"; cat "$WORK/$overlay.config"; exit 1
  fi
  for want in "metrics-port=9400  # env DLCP_METRICS_PORT" "health-port=7410  # env DLCP_HEALTH_PORT" \
              "tls-ca=/etc/dlcp/tls/ca.crt  # env DLCP_TLS_CA" "plaintext=false  # default" \
              "data-key-rotation-s=3600  # env DLCP_DATA_KEY_ROTATION_S"; do
    grep -qF "$want" "$WORK/$overlay.config" || {
      echo "dlcpd did not take '$want' from the $overlay ConfigMap"; cat "$WORK/$overlay.config"; exit 1; }
  done
  # Probes must hit the plaintext health port, and the TLS files must be mounted where they point.
  (cd "$WORK" && node -e '
    const YAML = require("yaml"); const fs = require("fs");
    for (const d of YAML.parseAllDocuments(fs.readFileSync(process.argv[1], "utf8"))) {
      const o = d.toJS(); if (!o || o.kind !== "DaemonSet") continue;
      for (const c of o.spec.template.spec.containers)
        for (const p of [c.readinessProbe, c.livenessProbe])
          if (!p || !p.grpc || p.grpc.port !== 7410) { console.log(`${c.name}: probe not on the health port`); process.exit(1); }
    }' "$WORK/$overlay.yaml") || { echo "$overlay: probes do not use the health port"; exit 1; }
  grep -q "mountPath: /etc/dlcp/tls" "$WORK/$overlay.yaml" || { echo "$overlay: TLS secret not mounted"; exit 1; }
done
echo "k8s check: overlays render, validate and configure dlcpd"
