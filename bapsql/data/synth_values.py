"""Drawing template values from a freshly built database, and the SQL/phrase helpers the templates share.

Contract: `DbView` runs trusted, generator-side SQL on a plain read-only connection and memoizes it; every draw goes
through the numpy Generator passed in, so the same database and seed draw the same values. Columns with dirty
values are compared through ``LOWER(TRIM(col))`` (`expr`) and their canonical values are lower-cased (`canon`);
coded columns are named by their label and the evidence hint gives the code (`filter_for`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bapsql.data.synth_schema import Col, Domain, Table

FEW_CHILDREN = 4  # a 'few children' parent for selective entity questions
ROUND_NOTE = " Round to 2 decimal places."
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def lit(value) -> str:
    """A SQL literal."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def nice(x: float) -> float | int:
    """Round a threshold to two significant digits (ints stay ints)."""
    if x == 0:
        return 0
    digits = 1 - int(np.floor(np.log10(abs(x))))
    r = round(float(x), digits)
    return int(r) if r == int(r) else r


class DbView:
    """Read-only access to a freshly built database for drawing template values (trusted, generator-side SQL)."""

    def __init__(self, path, domain: Domain) -> None:
        import apsw

        self.domain = domain
        self.conn = apsw.Connection(Path(path).resolve().as_uri() + "?mode=ro",
                                    flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        self._memo: dict[str, list] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def rows(self, sql: str) -> list[tuple]:
        if sql not in self._memo:
            self._memo[sql] = [tuple(r) for r in self.conn.execute(sql)]
        return self._memo[sql]

    def close(self) -> None:
        self.conn.close()

    def values(self, t: Table, c: Col) -> list[tuple[str, int]]:
        """Canonical values of a cat/code column with their counts (dirty variants folded, 'N/A' and NULL left out)."""
        e = expr(c)
        return self.rows(f"SELECT {e}, COUNT(*) FROM {t.name} WHERE {c.name} IS NOT NULL AND {c.name} <> 'N/A' "
                         f"GROUP BY {e} ORDER BY 2 DESC, 1")

    def quantile(self, t: Table, c: Col, q: float):
        """The q-quantile of a numeric column, from every k-th row of large tables (an actual value)."""
        key = f"{t.name}.{c.name}"
        if key not in self._arrays:
            n = self.rows(f"SELECT COUNT(*) FROM {t.name}")[0][0]
            k = max(1, n // 20_000)
            vals = [r[0] for r in self.conn.execute(
                f"SELECT {c.name} FROM {t.name} WHERE {c.name} IS NOT NULL AND id % {k} = 0")]
            self._arrays[key] = np.sort(np.asarray(vals, dtype=np.float64))
        arr = self._arrays[key]
        x = float(arr[min(len(arr) - 1, int(q * len(arr)))])
        return int(x) if c.kind == "int" else x

    def unique_names(self, t: Table, rng: np.random.Generator, k: int = 1) -> list[str]:
        """Up to k names of ``t`` that identify exactly one row."""
        nc = t.name_col
        if nc is None:
            return []
        cands = self.rows(f"SELECT {nc.name} FROM {t.name} GROUP BY {nc.name} HAVING COUNT(*) = 1 ORDER BY {nc.name}")
        if not cands:
            return []
        idx = rng.choice(len(cands), size=min(k, len(cands)), replace=False)
        return [cands[i][0] for i in sorted(idx.tolist())]


def expr(c: Col, table: str = "") -> str:
    ref = f"{table}.{c.name}" if table else c.name
    return f"LOWER(TRIM({ref}))" if c.dirty else ref


def canon(c: Col, v: str) -> str:
    return v.lower() if c.dirty else v


def dirty_hint(t: Table, c: Col) -> str:
    return (f"Values of {t.name}.{c.name} vary in letter case and surrounding spaces: compare them after trimming "
            f"and lower-casing (LOWER(TRIM({c.name}))).")


def pick(rng, seq):
    return seq[int(rng.integers(0, len(seq)))]


def cols_of(t: Table, *kinds: str, nullable: bool | None = None) -> list[Col]:
    out = [c for c in t.cols if c.kind in kinds]
    if nullable is not None:
        out = [c for c in out if bool(c.nulls or c.na) == nullable]
    return out


def filter_for(db: DbView, t: Table, rng, table_prefix: str = "") -> tuple[str, str, str, tuple[str, ...], str] | None:
    """A categorical filter: (SQL condition, question phrase, evidence, tags, column) over a cat or code column."""
    cols = cols_of(t, "cat", "code")
    if not cols:
        return None
    c = pick(rng, cols)
    vals = db.values(t, c)
    v = vals[int(rng.integers(0, len(vals)))][0]
    if c.kind == "code":
        label = c.labels[c.values.index(v)]
        cond = f"{table_prefix}{c.name} = {lit(v)}"
        ev = f"'{label}' refers to {c.name} = {lit(v)}"
        return cond, c.phrase.format(label=label), ev, ("evidence",), c.name
    cond = f"{expr(c, table_prefix.rstrip('.'))} = {lit(canon(c, v))}"
    phrase = f"{t.plural} whose {c.noun} is '{v}'"
    return cond, phrase, dirty_hint(t, c) if c.dirty else "", ("dirty",) if c.dirty else (), c.name


def agg_for(rng, c: Col) -> tuple[str, str, bool]:
    fn = pick(rng, ("AVG", "SUM", "MAX", "MIN", "AVG"))
    word = {"AVG": "average", "SUM": "total", "MAX": "highest", "MIN": "lowest"}[fn]
    rounded = fn == "AVG" or (fn == "SUM" and c.kind == "float")
    sql = f"ROUND({fn}({{col}}), 2)" if rounded else f"{fn}({{col}})"
    return sql, word, rounded


def label_col(db, t) -> Col | None:
    nc = t.name_col
    if nc is not None and db.rows(f"SELECT COUNT(DISTINCT {nc.name}) = COUNT(*) FROM {t.name}")[0][0]:
        return nc
    return t.cols[0]  # the primary key


def fk_for(db, t, rng, few: float = 0.0) -> tuple[Col, Table, str] | None:
    """A foreign key of ``t`` and the unique name of one parent; with probability ``few`` a parent with at most
    `FEW_CHILDREN` rows in ``t`` (a selective question)."""
    fks = [c for c in cols_of(t, "fk") if db.domain.table(c.ref).name_col is not None]
    if not fks:
        return None
    c = pick(rng, fks)
    parent = db.domain.table(c.ref)
    if rng.random() < few:
        pn = parent.name_col.name
        cands = db.rows(f"SELECT p.{pn} FROM {parent.name} p JOIN (SELECT {c.name} AS fk, COUNT(*) AS n FROM {t.name} "
                        f"GROUP BY {c.name}) c ON c.fk = p.id WHERE c.n <= {FEW_CHILDREN} AND p.{pn} IN (SELECT {pn} "
                        f"FROM {parent.name} GROUP BY {pn} HAVING COUNT(*) = 1) ORDER BY p.{pn}")
        return (c, parent, cands[int(rng.integers(0, len(cands)))][0]) if cands else None
    names = db.unique_names(parent, rng)
    return (c, parent, names[0]) if names else None


def join_sql(t: Table, c: Col, parent: Table) -> str:
    return f"{t.name} JOIN {parent.name} ON {t.name}.{c.name} = {parent.name}.id"


def named_fks(db, t) -> list[Col]:
    """Foreign keys whose parent has a unique name column (so a parent's name identifies it)."""
    return [c for c in cols_of(t, "fk") if label_col(db, db.domain.table(c.ref)).kind == "name"]

