from __future__ import annotations

from projects.models import ApiKey
from projects.services import (api_key_authenticate, api_key_authenticate_cached, api_key_record_use,
                               api_key_use_due)

from config.fast_path import db_call
from .http import ApiError


def _bearer_token(request) -> str:
    """The key from ``Authorization: Bearer <key>``, or an ApiError (401) saying what is wrong."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "missing_key", "send the project's ingest key as 'Authorization: Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "bad_authorization", "the Authorization header must be 'Bearer <key>'",
                       headers={"WWW-Authenticate": "Bearer"})
    return token.strip()


def _invalid_key() -> ApiError:
    return ApiError(401, "invalid_key", "the ingest key is unknown or revoked",
                    headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})


def authenticate_request(request) -> ApiKey:
    """The ingest key from ``Authorization: Bearer <key>``, or an ApiError (401)."""
    key = api_key_authenticate(raw_key=_bearer_token(request))
    if key is None:
        raise _invalid_key()
    return key


async def authenticate_request_async(request) -> ApiKey:
    """``authenticate_request`` for async views: a key this process checked recently is answered
    from memory on the event loop; otherwise (and for the once-a-minute "last used" write) the
    database is asked in a thread."""
    token = _bearer_token(request)
    key = api_key_authenticate_cached(raw_key=token)
    if key is None:
        key = await db_call(api_key_authenticate, raw_key=token)
        if key is None:
            raise _invalid_key()
    elif api_key_use_due(key=key):
        await db_call(api_key_record_use, key=key)
    return key
