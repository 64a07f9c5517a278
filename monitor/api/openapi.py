"""Print the API's OpenAPI document: ``python -m monitor.api.openapi > docs/openapi.json``.

The document does not depend on settings (limits and tokens are not part of it), so any settings do.
"""

from __future__ import annotations

import sys

from monitor.api.app import create_app, openapi_document
from monitor.config import Settings


def main() -> int:
    sys.stdout.write(openapi_document(create_app(Settings.from_env({"HOME": "/nonexistent"}, None))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
