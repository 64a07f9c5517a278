"""Optional login, from Streamlit secrets (``.streamlit/secrets.toml``); see docs/dashboard.md.

* OIDC: an ``[auth]`` table (Streamlit's own ``st.login`` settings) turns on single sign-on; the
  e-mail addresses in ``draftwatch.admins`` may acknowledge alerts and add silences.
* Password: ``draftwatch.password`` (read-only viewers) and/or ``draftwatch.admin_password``.
* Neither: no login, and whoever reaches the dashboard is an admin. ``draftwatch dashboard`` binds
  127.0.0.1 unless told otherwise, so that is the person on this machine.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any, Final

import streamlit as st

log = logging.getLogger(__name__)

ROLE_KEY: Final = "dw_role"


def _secrets() -> Mapping[str, Any]:
    try:
        return {key: st.secrets[key] for key in st.secrets}
    except Exception:  # no secrets file at all: Streamlit raises on first access
        return {}


def _settings() -> Mapping[str, Any]:
    section = _secrets().get("draftwatch", {})
    return section if isinstance(section, Mapping) else {}


def require_login() -> None:
    """Stop the run with a login form unless the visitor is signed in (or no login is configured)."""
    secrets = _secrets()
    own = _settings()
    if "auth" in secrets:
        if not st.user.is_logged_in:
            st.title("draftwatch")
            st.button("Log in", on_click=st.login, type="primary")
            st.stop()
        admins = {str(a).lower() for a in own.get("admins", [])}
        email = str(st.user.get("email") or "").lower()
        st.session_state[ROLE_KEY] = "admin" if email in admins else "viewer"
        with st.sidebar:
            st.caption(f"Signed in as {email or 'unknown'} ({st.session_state[ROLE_KEY]})")
            st.button("Log out", on_click=st.logout)
        return
    viewer, admin = own.get("password"), own.get("admin_password")
    if not viewer and not admin:
        st.session_state[ROLE_KEY] = "admin"
        return
    if st.session_state.get(ROLE_KEY) in ("admin", "viewer"):
        return
    st.title("draftwatch")
    with st.form("login"):
        typed = st.text_input("Password", type="password")
        if st.form_submit_button("Log in", type="primary"):
            # Constant-time comparison: the password is the only gate.
            if admin and hmac.compare_digest(typed.encode(), str(admin).encode()):
                st.session_state[ROLE_KEY] = "admin"
                st.rerun()
            if viewer and hmac.compare_digest(typed.encode(), str(viewer).encode()):
                st.session_state[ROLE_KEY] = "viewer"
                st.rerun()
            log.warning("dashboard: failed login")
            st.error("Wrong password.")
    st.stop()


def is_admin() -> bool:
    return st.session_state.get(ROLE_KEY) == "admin"
