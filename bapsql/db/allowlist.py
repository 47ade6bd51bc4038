"""What a policy statement may do in the sandbox: the vetted function and table allowlists, the authorizer actions
that are refused (with their rejection codes) and a lexer that finds a statement's first keyword and whether a second
statement follows. Pure data and pure functions; `bapsql.db.sandbox` applies them."""

from __future__ import annotations

import apsw

# Functions a query may call. Decided one by one from `SELECT name FROM pragma_function_list` of the bundled SQLite:
# core scalar, aggregate, window, date/time, math and JSON functions that are pure and bounded by the length limit.
# Denied (absent here): load_extension; random, randomblob, zeroblob (non-deterministic or blob bombs); changes,
# total_changes, last_insert_rowid (connection state); sqlite_version, sqlite_source_id, sqlite_compileoption_*,
# sqlite_log (introspection / writes to the error log); fts3_tokenizer, fts5*, bm25, highlight, snippet, offsets,
# matchinfo, match, optimize (full-text internals); rtreecheck, rtreedepth, rtreenode, geopoly_* (extension
# internals); subtype. The date/time functions accept 'now' (as do current_date/time/timestamp): benchmark gold SQL
# uses them, and their only hazard is that a result depends on the clock.
ALLOWED_FUNCTIONS: frozenset[str] = frozenset(
    """
    -> ->> abs acos acosh asin asinh atan atan2 atanh avg ceil ceiling char coalesce concat concat_ws cos cosh count
    cume_dist current_date current_time current_timestamp date datetime degrees dense_rank exp first_value floor
    format glob group_concat hex if ifnull iif instr json json_array json_array_insert json_array_length
    json_error_position json_extract json_group_array json_group_object json_insert json_object json_patch
    json_pretty json_quote json_remove json_replace json_set json_type json_valid jsonb jsonb_array
    jsonb_array_insert jsonb_extract jsonb_group_array jsonb_group_object jsonb_insert jsonb_object jsonb_patch
    jsonb_remove jsonb_replace jsonb_set julianday lag last_value lead length like likelihood likely ln log log10 log2
    lower ltrim max median min mod nth_value ntile nullif octet_length percent_rank percentile percentile_cont
    percentile_disc pi pow power printf quote radians rank replace round row_number rtrim sign sin sinh sqrt strftime
    string_agg substr substring sum tan tanh time timediff total trim trunc typeof unhex unicode unistr unistr_quote
    unixepoch unlikely upper
    """.split()
)

# Table-valued functions (eponymous virtual tables) a query may read besides the database's own tables and views.
ALLOWED_TABLE_FUNCTIONS: frozenset[str] = frozenset({"json_each", "json_tree", "jsonb_each", "jsonb_tree"})
# Eponymous virtual tables (and temp schema tables) that are never readable, even when no column is read.
DENIED_TABLE_FUNCTIONS: frozenset[str] = frozenset(
    {"dbstat", "carray", "generate_series", "sqlite_dbpage", "sqlite_stmt", "sqlite_temp_master", "sqlite_temp_schema",
     "fts3tokenize", "fts4aux", "fts5vocab"}
)
SCHEMA_TABLES = frozenset({"sqlite_master", "sqlite_schema"})

# Authorizer action → rejection code, for everything that is not a plain read.
DENIED_ACTIONS: dict[int, str] = {
    **{getattr(apsw, f"SQLITE_{n}"): "write" for n in ("INSERT", "UPDATE", "DELETE", "COPY")},
    **{
        getattr(apsw, f"SQLITE_{n}"): "ddl"
        for n in (
            "CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
            "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DROP_INDEX", "DROP_TABLE", "DROP_TEMP_INDEX",
            "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER", "DROP_VIEW", "ALTER_TABLE",
            "CREATE_VTABLE", "DROP_VTABLE",
        )
    },
    apsw.SQLITE_PRAGMA: "pragma",
    apsw.SQLITE_ATTACH: "attach",
    apsw.SQLITE_DETACH: "detach",
    apsw.SQLITE_TRANSACTION: "transaction",
    apsw.SQLITE_SAVEPOINT: "transaction",
    apsw.SQLITE_ANALYZE: "analyze",
    apsw.SQLITE_REINDEX: "reindex",
}

# First keyword of a refused statement → rejection code (a friendlier message than the authorizer's).
KEYWORD_CODES: dict[str, str] = {
    "insert": "write", "update": "write", "delete": "write", "replace": "write", "upsert": "write",
    "create": "ddl", "drop": "ddl", "alter": "ddl", "pragma": "pragma", "attach": "attach", "detach": "detach",
    "begin": "transaction", "commit": "transaction", "end": "transaction", "rollback": "transaction",
    "savepoint": "transaction", "release": "transaction", "vacuum": "vacuum", "analyze": "analyze",
    "reindex": "reindex", "explain": "explain",
}
READ_KEYWORDS = frozenset({"select", "with", "values"})


def scan_statement(sql: str) -> tuple[str, bool]:
    """Lex ``sql`` the way SQLite does for statement boundaries: skip ``--`` and ``/* */`` comments, '...' strings
    and "..."/`...`/[...] identifiers. Return (lowercased first keyword, whether non-trivial text follows the first
    top-level semicolon)."""
    i, n = 0, len(sql)
    first = ""
    seen_token = False
    after_semicolon = False
    while i < n:
        ch = sql[i]
        if ch in " \t\n\r\f\v":
            i += 1
            continue
        if sql.startswith("--", i):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if ch == ";":
            after_semicolon = seen_token or after_semicolon
            i += 1
            continue
        if after_semicolon:
            return first, True
        seen_token = True
        if ch in "'\"`":
            while True:  # quoted string / identifier; a doubled quote is an escaped quote
                j = sql.find(ch, i + 1)
                if j < 0:
                    i = n
                    break
                if j + 1 < n and sql[j + 1] == ch:
                    i = j + 1
                    continue
                i = j + 1
                break
            continue
        if ch == "[":
            j = sql.find("]", i + 1)
            i = n if j < 0 else j + 1
            continue
        if not first and (ch.isalpha() or ch == "_"):
            j = i
            while j < n and (sql[j].isalnum() or sql[j] == "_"):
                j += 1
            first = sql[i:j].lower()
            i = j
            continue
        if not first:
            first = ch
        i += 1
    return first, False
