from __future__ import annotations

from projects.models import ApiKey
from projects.services import api_key_authenticate

from .http import ApiError


def authenticate_request(request) -> ApiKey:
    """The ingest key from ``Authorization: Bearer <key>``, or an ApiError (401)."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "missing_key", "send the project's ingest key as 'Authorization: Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "bad_authorization", "the Authorization header must be 'Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    key = api_key_authenticate(raw_key=token.strip())
    if key is None:
        raise ApiError(401, "invalid_key", "the ingest key is unknown or revoked",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
    return key
