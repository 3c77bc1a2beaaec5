"""A corpus of attempts to escape the hub's query API, and a runner that tries each against a hub's URL.

Every attempt must be refused: it reads outside fleetlens's tables (files, URLs, other servers,
processes, dictionaries, system tables), writes anything, changes a setting, or hides a second statement.
They come in families with their variants (quoting, case, comments, heredocs, WITH and INSERT shapes),
as people who attack SQL endpoints write them. `{canary}` stands for a directory the test watches for
files written, `{listener}` for the address of a loopback server that notes any request reaching it.

    outcomes = run(hub_url, token, canary_dir, listener_address)
    escaped = [o for o in outcomes if o.status == 200]
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

FILE_READS = [
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM `file`('/etc/passwd', 'LineAsString')",
    "SELECT * FROM \"file\"('/etc/passwd', 'LineAsString')",
    "SELECT * FROM FILE('/etc/passwd', 'LineAsString')",
    "select * from FiLe('/etc/passwd', 'LineAsString')",
    "SELECT * FROM file/**/('/etc/passwd', 'LineAsString')",
    "SELECT * FROM file -- a comment\n('/etc/passwd', 'LineAsString')",
    "SELECT * FROM file('/etc/pass*', 'LineAsString')",
    "SELECT * FROM file('/proc/self/environ', 'RawBLOB')",
    "SELECT * FROM filesystem('/etc')",
    "SELECT name FROM filesystem('/') LIMIT 5",
    "SELECT * FROM fileCluster('default', '/etc/passwd', 'LineAsString')",
    "SELECT * FROM sqlite('/etc/passwd', 't')",
    "SELECT * FROM deltaLakeLocal('/etc')",
    "SELECT * FROM icebergLocal('/etc')",
    "SELECT * FROM format(LineAsString, 'root')",
    "SELECT * FROM input('line String')",
    "SELECT * FROM python(x)",
    "SELECT * FROM arrowstream('/etc/passwd')",
    "SELECT * FROM mergeTreeIndex(currentDatabase(), samples)",
    "SELECT * FROM (SELECT * FROM file('/etc/passwd', 'LineAsString'))",
    "SELECT (SELECT any(line) FROM file('/etc/passwd', 'LineAsString'))",
    "SELECT count() FROM samples WHERE metric IN (SELECT line FROM file('/etc/passwd', 'LineAsString'))",
    "SELECT * FROM samples AS s JOIN file('/etc/passwd', 'LineAsString') AS f ON 1",
    "SELECT * FROM samples, file('/etc/passwd', 'LineAsString')",
    "SELECT * FROM samples UNION ALL SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "EXPLAIN SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "EXPLAIN PIPELINE SELECT * FROM file('/etc/passwd', 'LineAsString')",
]
NETWORK = [
    "SELECT * FROM url('http://{listener}/x', 'LineAsString')",
    "SELECT * FROM URL('http://{listener}/x', 'LineAsString')",
    "SELECT * FROM `url`('http://{listener}/x', 'LineAsString')",
    "SELECT * FROM urlCluster('default', 'http://{listener}/x', 'LineAsString')",
    "SELECT * FROM s3('http://{listener}/bucket/x', 'LineAsString')",
    "SELECT * FROM gcs('http://{listener}/bucket/x', 'LineAsString')",
    "SELECT * FROM azureBlobStorage('http://{listener}', 'c', 'x')",
    "SELECT * FROM hdfs('hdfs://{listener}/x', 'LineAsString')",
    "SELECT * FROM remote('{listener}', system.one)",
    "SELECT * FROM remoteSecure('{listener}', system.one)",
    "SELECT * FROM cluster('default', system.one)",
    "SELECT * FROM clusterAllReplicas('default', system.one)",
    "SELECT * FROM mysql('{listener}', 'db', 't', 'u', 'p')",
    "SELECT * FROM postgresql('{listener}', 'db', 't', 'u', 'p')",
    "SELECT * FROM mongodb('{listener}', 'db', 'c', 'u', 'p', 'x String')",
    "SELECT * FROM redis('{listener}', 'k', 'k String')",
    "SELECT * FROM jdbc('jdbc:mysql://{listener}/db', 't')",
    "SELECT * FROM odbc('DSN=x', 't')",
    "SELECT * FROM iceberg('http://{listener}/x')",
    "SELECT * FROM deltaLake('http://{listener}/x')",
    "SELECT * FROM hudi('http://{listener}/x')",
    "SELECT * FROM prometheusQuery('http://{listener}', 'up')",
    "SELECT * FROM ytsaurus('http://{listener}', '//t', 'x')",
    "SELECT aiGenerate('hello')",
    "SELECT * FROM numbers(1) WHERE aiFilter('x', 'y')",
]
PROCESSES_AND_DICTIONARIES = [
    "SELECT * FROM executable('cat /etc/passwd', 'LineAsString', 'line String')",
    "SELECT * FROM executable('id', 'TabSeparated', 'x String')",
    "SELECT * FROM dictionary('any')",
    "SELECT dictGet('any', 'x', 1)",
    "SELECT dictGetString('any', 'x', toUInt64(1))",
    "SELECT dictHas('any', 1)",
    "SELECT joinGet('samples', 'value', 1)",
    "SELECT * FROM merge('system', '.*')",
    "SELECT * FROM merge(currentDatabase(), '.*')",
    "SELECT * FROM view(SELECT * FROM system.tables)",
    "SELECT * FROM viewIfPermitted(SELECT * FROM system.users ELSE null('x String'))",
    "SELECT * FROM loop(numbers(1))",
    "SELECT * FROM generateRandom('a String') LIMIT 1",
    "SELECT * FROM timeSeriesData(samples)",
]
SCALAR_FUNCTIONS = [
    "SELECT file('/etc/passwd')",
    "SELECT FILE('/etc/passwd')",
    "SELECT `file`('/etc/passwd')",
    "SELECT arrayMap(p -> file(p), ['/etc/passwd'])",
    "SELECT if(1, file('/etc/passwd'), '')",
    "SELECT getSetting('readonly')",
    "SELECT getSettingOrDefault('max_execution_time', 0)",
    "SELECT getServerSetting('path')",
    "SELECT hostName(), FQDN(), currentUser()",
    "SELECT filesystemAvailable(), filesystemCapacity()",
    "SELECT getMacro('shard')",
    "SELECT sleep(3)",
    "SELECT sleepEachRow(1) FROM numbers(10)",
    "SELECT throwIf(1, 'x')",
    "SELECT addressToSymbol(toUInt64(0))",
    "SELECT evalMLMethod('x')",
    "SELECT hasColumnInTable('system', 'users', 'name')",
    "SELECT * APPLY(file) FROM (SELECT '/etc/passwd' AS p)",
    "SELECT uptime(), version(), serverUUID()",
]
CATALOG = [
    "SELECT * FROM system.tables",
    "SELECT * FROM `system`.`tables`",
    'SELECT * FROM "system"."tables"',
    "SELECT * FROM SYSTEM.TABLES",
    "SELECT name FROM system.settings WHERE changed",
    "SELECT * FROM system.processes",
    "SELECT * FROM system.users",
    "SELECT query FROM system.query_log",
    "SELECT * FROM system.functions",
    "SELECT * FROM system.one",
    "SELECT * FROM INFORMATION_SCHEMA.TABLES",
    "SELECT * FROM information_schema.columns",
    "SELECT * FROM samples WHERE 1 IN system.one",
    "SELECT count() FROM samples WHERE metric IN (SELECT name FROM system.tables)",
    "WITH t AS (SELECT * FROM system.tables) SELECT * FROM t",
    "SELECT * FROM other_database.samples",
    "SELECT * FROM `fleetlens.samples`",
    "SHOW TABLES",
    "SHOW TABLES FROM system",
    "SHOW CREATE TABLE samples",
    "SHOW GRANTS",
    "SHOW SETTINGS LIKE '%'",
    "DESCRIBE TABLE system.users",
    "DESCRIBE file('/etc/passwd')",
    "EXISTS TABLE system.users",
]
WRITES = [
    "INSERT INTO steps (job) VALUES ('x')",
    "INSERT INTO steps SELECT * FROM steps",
    "INSERT INTO FUNCTION file('{canary}/insert.csv', 'CSV') SELECT 1",
    "SELECT 1 INTO OUTFILE '{canary}/outfile.csv'",
    "SELECT 1 INTO OUTFILE '{canary}/outfile2.csv' AND STDOUT",
    "SELECT 1 INTO OUTFILE '{canary}/outfile3.csv' TRUNCATE FORMAT CSV",
    "DROP TABLE steps",
    "DROP DATABASE IF EXISTS fleetlens",
    "TRUNCATE TABLE steps",
    "ALTER TABLE steps DELETE WHERE 1",
    "ALTER TABLE steps DROP COLUMN data_s",
    "DELETE FROM steps WHERE 1",
    "UPDATE steps SET job = 'x' WHERE 1",
    "CREATE TABLE pwned (a Int8) ENGINE = Memory",
    "CREATE TABLE pwned ENGINE = File(CSV, '{canary}/create.csv') AS SELECT 1",
    "CREATE DICTIONARY d (x String) PRIMARY KEY x SOURCE(FILE(path '/etc/passwd' format 'LineAsString'))",
    "CREATE FUNCTION pwn AS () -> 1",
    "CREATE USER pwned",
    "GRANT ALL ON *.* TO default",
    "RENAME TABLE steps TO steps_gone",
    "OPTIMIZE TABLE steps FINAL",
    "ATTACH TABLE pwned FROM '{canary}' (a Int8) ENGINE = Memory",
    "DETACH TABLE steps",
    "SYSTEM SHUTDOWN",
    "SYSTEM DROP DNS CACHE",
    "KILL QUERY WHERE 1",
    "BACKUP TABLE steps TO File('{canary}/backup')",
    "SET readonly = 0",
    "USE system",
]
MULTI_STATEMENTS = [
    "SELECT 1; DROP TABLE steps",
    "SELECT 1;DROP TABLE steps;",
    "SELECT 1 /* ; */; DROP TABLE steps",
    "SELECT 1 -- ;\n; DROP TABLE steps",
    "SELECT $$x$$; DROP TABLE steps",
    "SELECT $$x$$;; DROP TABLE steps",
    "SELECT $tag$x$tag$; DROP TABLE steps",
    "SELECT 'a'';'; DROP TABLE steps",
    "SELECT 'a\\';'; DROP TABLE steps",
    'SELECT "x;" FROM steps; DROP TABLE steps',
    "  -- a comment\n  drop table steps",
    "/* SELECT */ DROP TABLE steps",
    "SELECT 1; INSERT INTO FUNCTION file('{canary}/multi.csv', 'CSV') SELECT 1",
    "SELECT 1; SET readonly = 0; SELECT 2",
]
SETTINGS = [
    "SELECT 1 SETTINGS max_execution_time = 0",
    'SELECT 1 SETTINGS "max_execution_time" = 0',
    "SELECT 1 SETTINGS `max_execution_time` = 0",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT number FROM numbers(10) SETTINGS max_result_rows = 0",
    "SELECT * FROM (SELECT 1 SETTINGS max_execution_time = 0)",
    "EXPLAIN json = 1 SELECT 1",
    "SELECT 1 SETTINGS allow_ddl = 1",
]
SHAPES = [
    "WITH x AS (SELECT 1) INSERT INTO steps (job) SELECT 'x'",
    "WITH (SELECT any(line) FROM file('/etc/passwd', 'LineAsString')) AS x SELECT x",
    "WITH file AS (SELECT 1) SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "WITH tables AS (SELECT 1) SELECT * FROM system.tables",
    "WITH p AS (SELECT '/etc/passwd') SELECT file((SELECT * FROM p))",
    "SELECT 1 FORMAT TabSeparated",
    "SELECT 1 FORMAT Native",
    "SELECT * FROM {table:Identifier}",
    "SELECT {column:Identifier} FROM steps",
    "SELECT * FROM steps WHERE job = {job:String} UNION ALL SELECT * FROM {table:Identifier}",
]
FAMILIES = {
    "files": FILE_READS,
    "network": NETWORK,
    "processes and dictionaries": PROCESSES_AND_DICTIONARIES,
    "scalar functions": SCALAR_FUNCTIONS,
    "catalog and other databases": CATALOG,
    "writes and DDL": WRITES,
    "multi-statements and heredocs": MULTI_STATEMENTS,
    "setting overrides": SETTINGS,
    "WITH, INSERT and parameter shapes": SHAPES,
}
PARAMETERS = {"table": "system.users", "column": "name", "job": "x"}


@dataclass(frozen=True)
class Outcome:
    family: str
    sql: str
    status: int
    answer: str


def attempts(canary: str, listener: str) -> list[tuple[str, str]]:
    """(family, statement) for every attempt, with the canary directory and listener filled in."""
    return [
        (family, sql.replace("{canary}", canary).replace("{listener}", listener))
        for family, statements in FAMILIES.items()
        for sql in statements
    ]


def post_query(
    url: str, token: str | None, sql: str, parameters: dict | None = None, timeout_s: float = 40.0
) -> tuple[int, str]:
    """POST one statement to a hub's query API; the status and the answer's text (status 0: none came)."""
    body = json.dumps({"sql": sql, "parameters": parameters or {}}).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(f"{url}/api/v1/sql", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (OSError, urllib.error.URLError) as error:  # no answer: the hub hung or died on it
        return 0, f"no answer: {error}"


def run(url: str, token: str | None, canary: str, listener: str) -> list[Outcome]:
    """Try every attempt once, in order; each one's outcome."""
    return [
        Outcome(family, sql, *post_query(url, token, sql, PARAMETERS if "{" in sql else None))
        for family, sql in attempts(canary, listener)
    ]
