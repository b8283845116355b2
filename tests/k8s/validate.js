// usage: node validate.js FILE.yaml...
// Every object must validate against the Kubernetes schema (kubernetes-models, offline), and every
// workload must pass dlcp's policy: probes, requests and limits, a pinned image, non-root, a
// read-only root filesystem, no privilege escalation, all capabilities dropped (IPC_LOCK may be
// added back). Batch workloads (Job, PyTorchJob) serve nothing, so they need no probes. CRDs
// (ServiceMonitor, PyTorchJob) get structural checks, and the policy on their pod templates.
const fs = require("fs");
const YAML = require("yaml");
const models = require("kubernetes-models");

const camel = (g) => g.replace(/\.([a-z])/g, (_, c) => c.toUpperCase());
const CRDS = {
  "monitoring.coreos.com/v1/ServiceMonitor": checkServiceMonitor,
  "kubeflow.org/v1/PyTorchJob": checkPyTorchJob,
  "cert-manager.io/v1/Issuer": checkIssuer,
  "cert-manager.io/v1/Certificate": checkCertificate,
};
let bad = 0;
const fail = (id, msg) => { bad++; console.log(`${id}: FAIL ${msg}`); };

function checkServiceMonitor(obj, id) {
  const eps = obj.spec?.endpoints ?? [];
  if (!obj.spec?.selector?.matchLabels) fail(id, "no selector");
  if (!eps.length || eps.some((e) => !e.port)) fail(id, "endpoints need a named port");
}

function checkIssuer(obj, id) {
  const kinds = ["selfSigned", "ca", "acme", "vault", "venafi"].filter((k) => obj.spec?.[k] !== undefined);
  if (kinds.length !== 1) fail(id, `an Issuer needs exactly one kind, has ${kinds.join(",") || "none"}`);
  if (obj.spec?.ca && !obj.spec.ca.secretName) fail(id, "a CA Issuer needs secretName");
}

function checkCertificate(obj, id) {
  const s = obj.spec ?? {};
  if (!s.secretName) fail(id, "no secretName");
  if (!s.issuerRef?.name) fail(id, "no issuerRef.name");
  if (!s.isCA && !(s.usages ?? []).length) fail(id, "no usages");
  if (!s.commonName && !(s.dnsNames ?? []).length) fail(id, "names nothing");
  const known = ["signing", "digital signature", "content commitment", "key encipherment", "key agreement",
                 "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
                 "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
                 "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc"];
  for (const u of s.usages ?? []) if (!known.includes(u)) fail(id, `unknown usage '${u}'`);
}

function checkPyTorchJob(obj, id) {
  const replicas = obj.spec?.pytorchReplicaSpecs ?? {};
  if (!replicas.Master) fail(id, "no Master replica");
  for (const [role, r] of Object.entries(replicas)) {
    const spec = r.template?.spec;
    if (!spec) { fail(id, `${role} has no pod template`); continue; }
    if (!(spec.containers ?? []).some((c) => c.name === "pytorch")) fail(id, `${role} has no container named pytorch`);
    // Validate the template as a Pod against the schema, then the policy.
    try { new models.v1.Pod({ apiVersion: "v1", kind: "Pod", metadata: {}, spec }).validate(); }
    catch (e) { fail(id, `${role} pod template: ${e.message}`); continue; }
    checkPodSpec(spec, `${id} ${role}`, true);
  }
}

function checkPodSpec(spec, id, batch = false) {
  const psc = spec.securityContext ?? {};
  for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) {
    const cid = `${id} container ${c.name}`;
    const sc = c.securityContext ?? {};
    if (!batch && !c.readinessProbe) fail(cid, "no readinessProbe");
    if (!batch && !c.livenessProbe) fail(cid, "no livenessProbe");
    for (const k of ["cpu", "memory"]) {
      if (!c.resources?.requests?.[k]) fail(cid, `no ${k} request`);
      if (!c.resources?.limits?.[k]) fail(cid, `no ${k} limit`);
    }
    const image = c.image ?? "";
    const tag = image.includes("@sha256:") ? "digest" : image.split("/").pop().split(":")[1];
    if (!tag || tag === "latest") fail(cid, `image '${image}' is not pinned to a tag or digest`);
    if (!(sc.runAsNonRoot ?? psc.runAsNonRoot)) fail(cid, "runAsNonRoot is not true");
    const uid = sc.runAsUser ?? psc.runAsUser;
    if (uid === undefined || uid === 0) fail(cid, "runAsUser must be a non-zero uid");
    if (sc.readOnlyRootFilesystem !== true) fail(cid, "readOnlyRootFilesystem is not true");
    if (sc.allowPrivilegeEscalation !== false) fail(cid, "allowPrivilegeEscalation is not false");
    if (sc.privileged) fail(cid, "privileged");
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) fail(cid, "capabilities do not drop ALL");
    const extra = (sc.capabilities?.add ?? []).filter((cap) => cap !== "IPC_LOCK");
    if (extra.length) fail(cid, `adds capabilities ${extra.join(",")}`);
  }
}

for (const file of process.argv.slice(2)) {
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, "utf8"))) {
    if (doc.errors.length) { fail(file, `YAML error ${doc.errors[0].message}`); continue; }
    const obj = doc.toJS();
    if (!obj) continue;
    const id = `${file}: ${obj.apiVersion}/${obj.kind} ${obj.metadata?.name}`;
    const crd = CRDS[`${obj.apiVersion}/${obj.kind}`];
    if (crd) {
      const before = bad;
      crd(obj, id);
      if (bad === before) console.log(`${id}: checked (CRD)`);
      continue;
    }
    const [group, version] = obj.apiVersion.includes("/") ? obj.apiVersion.split("/") : [null, obj.apiVersion];
    const Cls = (group ? models[camel(group)] : models)?.[version]?.[obj.kind];
    if (!Cls) { fail(id, "unknown kind"); continue; }
    try { new Cls(obj).validate(); } catch (e) { fail(id, `schema: ${e.message}`); continue; }
    const before = bad;
    const pod = obj.spec?.template?.spec ?? (obj.kind === "Pod" ? obj.spec : null);
    if (pod) checkPodSpec(pod, id, ["Job", "CronJob"].includes(obj.kind));
    if (bad === before) console.log(`${id}: OK`);
  }
}
console.log(bad ? `${bad} problem(s)` : "all manifests valid");
process.exit(bad ? 1 : 0);
