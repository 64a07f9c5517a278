# Sourced by the ensure-*.sh scripts: what each of them does the same way.

# The cache root, resolved as decoder/models/fetch.py's cache_dir resolves it.
if [ -n "${DRAFTWATCH_CACHE_DIR:-}" ]; then
    CACHE="$DRAFTWATCH_CACHE_DIR"
elif [ -n "${XDG_CACHE_HOME:-}" ]; then
    CACHE="$XDG_CACHE_HOME/draftwatch"
else
    CACHE="$HOME/.cache/draftwatch"
fi

SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi

# Debian packages, quietly, with no recommends.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq >/dev/null
    $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Waits while another run holds LOCK (a second make test waits for the first one's install instead
# of doing it again) and holds it until the script exits; without flock it does not wait.
wait_turn() {
    command -v flock >/dev/null 2>&1 || return 0
    exec 9>"$1"
    flock 9
}
