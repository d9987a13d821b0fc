-- Least-privilege roles for voltro_beat, in the database that holds its tables. Run as a
-- superuser or the database's owner, before the first `voltro-beat db upgrade`, and again
-- whenever you like (every statement is idempotent):
--
--   VOLTRO_BEAT_DB_PASSWORD=... VOLTRO_BEAT_MIGRATOR_PASSWORD=... \
--       psql -v ON_ERROR_STOP=1 -d app -f deploy/postgresql/roles.sql
--
-- Two roles (names can be changed with -v beat_role=... -v migrator_role=..., the schema with
-- -v schema=...; the default is public):
--
-- * the migrator owns voltro_beat's tables and runs `voltro-beat db upgrade`; it may create
--   tables in the schema, nothing more;
-- * the beat role, for beat replicas, workers (voltro_beat.attach), `voltro-beat trigger`
--   and the admin, may SELECT, INSERT, UPDATE and DELETE rows of the tables the migrator
--   creates, and nothing else: no DDL, no TRUNCATE, no other table. Run them with
--   voltro_beat_migrate off (VOLTRO_BEAT_MIGRATE=false).
--
-- Passwords come from the environment (psql's \getenv: psql 15 or newer), never from the
-- command line; without one the role keeps the password it has (or none).
--
-- On PostgreSQL 14 or older every role may CREATE in the schema public unless revoked
-- (REVOKE CREATE ON SCHEMA public FROM PUBLIC, the default since 15): do that, or use a
-- schema of voltro_beat's own, for the beat role to have no DDL at all.

\set ON_ERROR_STOP on
\if :{?beat_role}
\else
    \set beat_role voltro_beat
\endif
\if :{?migrator_role}
\else
    \set migrator_role voltro_beat_migrator
\endif
\if :{?schema}
\else
    \set schema public
\endif
\getenv beat_password VOLTRO_BEAT_DB_PASSWORD
\getenv migrator_password VOLTRO_BEAT_MIGRATOR_PASSWORD

SELECT format('CREATE ROLE %I LOGIN', :'migrator_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'migrator_role') \gexec
SELECT format('CREATE ROLE %I LOGIN', :'beat_role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'beat_role') \gexec
\if :{?migrator_password}
    ALTER ROLE :"migrator_role" PASSWORD :'migrator_password';
\endif
\if :{?beat_password}
    ALTER ROLE :"beat_role" PASSWORD :'beat_password';
\endif

CREATE SCHEMA IF NOT EXISTS :"schema";
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"migrator_role";
GRANT USAGE ON SCHEMA :"schema" TO :"beat_role";

-- voltro_beat's tables made before this script (by beat at boot, as the app's role) move to
-- the migrator, so that it can upgrade them.
SELECT format('ALTER TABLE %I.%I OWNER TO %I', schemaname, tablename, :'migrator_role')
FROM pg_tables
WHERE schemaname = :'schema' AND tablename LIKE '\_voltro\_%' AND tableowner <> :'migrator_role'
\gexec

-- Rows of every table the migrator creates from now on (its tables are voltro_beat's only),
-- and of those it has already.
ALTER DEFAULT PRIVILEGES FOR ROLE :"migrator_role" IN SCHEMA :"schema"
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"beat_role";
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO %I',
              schemaname, tablename, :'beat_role')
FROM pg_tables
WHERE schemaname = :'schema' AND tableowner = :'migrator_role'
\gexec
