# Local stand-in for the public PostgreSQL image docker-compose.yml names, which cannot be
# pulled on a machine without registry access: Debian bookworm's PostgreSQL 15 with an
# entrypoint that honours the same POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB and
# POSTGRES_INITDB_ARGS, keeps data in /var/lib/postgresql/data and has pg_isready on PATH.
# docker/test.sh builds it only when no image of that name exists.
FROM debian:bookworm-slim
RUN mkdir -p /etc/postgresql-common/createcluster.d \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/stand-in.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PGDATA=/var/lib/postgresql/data
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
LABEL org.myelin.stand-in="postgres image, built by docker/test.sh from Debian's postgresql-15"
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
