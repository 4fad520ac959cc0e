"""Test settings: the real settings, with the embedded data dir moved to a fresh temporary
directory so a test run never touches (or collides with) the data of a running `make run`."""

import os
import tempfile

if not os.environ.get("TRACEDASH_TEST_KEEP_DATA_DIR"):
    os.environ["TRACEDASH_DATA_DIR"] = tempfile.mkdtemp(prefix="tracedash-test-")

from config.settings import *  # noqa: E402,F401,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests only
