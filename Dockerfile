# tracedash application image: one image for web, Celery worker, Celery beat and migrations
# (docker-compose.yml picks the command). Agents on GPU hosts run separately.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRACEDASH_DATA_DIR=/data

WORKDIR /app

RUN groupadd --system tracedash \
 && useradd --system --gid tracedash --home-dir /app --no-create-home --shell /usr/sbin/nologin tracedash

# Dependencies first, so a code change does not reinstall them.
COPY requirements.lock ./
RUN pip install --no-cache-dir -r requirements.lock

COPY . .

# collectstatic only needs settings to import; the key is a throwaway set for this one command
# (not an ENV, so it never reaches a running container; compose requires the real one).
# /data is created owned by tracedash so a fresh named volume mounted there inherits that owner.
RUN TRACEDASH_SECRET_KEY=collectstatic-build-only-key-never-used-at-runtime \
    python manage.py collectstatic --noinput \
 && mkdir -p /data \
 && chown -R tracedash:tracedash /data

USER tracedash

EXPOSE 8000

CMD ["python", "manage.py", "serve", "--host", "0.0.0.0", "--port", "8000"]
