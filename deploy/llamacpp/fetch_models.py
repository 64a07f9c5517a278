"""Fills the models volume: each MODEL_<NAME>_URL in the environment is downloaded to /models/<name>.gguf.

Run by the Job in fetch.yaml (the draftwatch image's python3, the standard library only). A file already
there is kept when it matches MODEL_<NAME>_SHA256 (or when no hash is given), so the Job can run again;
a download goes to a temporary name first and is renamed once complete and checked, so the llama-servers
never read half a file. Proxies come from HTTPS_PROXY, as for any urllib client.
"""

import hashlib
import os
import re
import shutil
import sys
import urllib.request
from pathlib import Path

DIR = Path(os.environ.get("MODELS_DIR", "/models"))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main() -> int:
    wanted = {m[1].lower(): v for k, v in os.environ.items() if (m := re.fullmatch(r"MODEL_(\w+)_URL", k)) and v}
    if not wanted:
        print("fetch_models: no MODEL_<NAME>_URL set", file=sys.stderr)
        return 2
    for name, url in sorted(wanted.items()):
        path = DIR / f"{name}.gguf"
        expected = os.environ.get(f"MODEL_{name.upper()}_SHA256", "").lower()
        if path.exists() and (not expected or sha256(path) == expected):
            print(f"fetch_models: {path} is there")
            continue
        part = path.with_name(path.name + ".part")
        print(f"fetch_models: {url} -> {path}")
        with urllib.request.urlopen(url, timeout=60) as response, part.open("wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
        if expected and (found := sha256(part)) != expected:
            part.unlink()
            print(f"fetch_models: {url}: sha256 {found}, expected {expected}", file=sys.stderr)
            return 1
        part.replace(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
