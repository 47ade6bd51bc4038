"""The deterministic training corpus of the packaged tokenizer (see `bapsql.models.tokenizer_build`).

Contract: `corpus_lines(scale, seed)` yields the same lines for the same arguments, on every machine: SQL over made-up
schemas (upper and lower case, one-line and multi-line layouts, common SQLite functions), English questions with
numbers, dates and names, JSON tool calls of the environment's actions, observations (result rows, estimates, budget
ledgers, schemas), English prose over ~1,200 common words with inflections, and the text between the chat template's
special tokens (role headers, the tools preamble). Special-token strings never appear in it.
"""

from __future__ import annotations

import json
import random
from typing import Iterator

# The template's default system message (the chat template in tokenizer_build renders it when none is given).
DEFAULT_SYSTEM = "You are a helpful assistant."

SQL_KEYWORDS = (
    "SELECT FROM WHERE AND OR NOT IN IS NULL LIKE BETWEEN GROUP BY ORDER HAVING LIMIT OFFSET JOIN INNER LEFT OUTER "
    "CROSS ON AS DISTINCT COUNT SUM AVG MIN MAX CASE WHEN THEN ELSE END UNION ALL INTERSECT EXCEPT EXISTS ASC DESC "
    "CAST INTEGER REAL TEXT CREATE TABLE PRIMARY KEY FOREIGN REFERENCES EXPLAIN QUERY PLAN WITH IIF ROUND LENGTH "
    "SUBSTR COALESCE IFNULL LOWER UPPER REPLACE INSTR TOTAL ABS DATE STRFTIME JULIANDAY NUMERIC VARCHAR"
).split()
_ENTITIES = (
    "singer concert stadium employee department student course enrollment order customer product supplier invoice "
    "payment flight airport airline movie director rating player team match game school district account loan "
    "transaction client patient doctor visit book author publisher city country region store sale artist album "
    "track genre hotel room booking member club event race driver circuit result station train trip user post "
    "comment badge vote tag molecule atom bond card set legality superhero power hero company shop item warehouse"
).split()
_COLUMNS = (
    "id name age country city year price amount date salary title rating score gender email phone address status "
    "type category quantity total population budget capacity duration rank height weight points goals wins losses "
    "start_date end_date created_at birth_date release_year revenue cost discount balance frequency district_id "
    "first_name last_name full_name description code level grade credits language model color size speed value"
).split()
_FIRST = (
    "James Mary John Patricia Robert Jennifer Michael Linda William Elizabeth David Barbara Richard Susan Joseph "
    "Jessica Thomas Sarah Charles Karen Daniel Nancy Matthew Lisa Anthony Betty Mark Sandra Paul Ashley Steven Emily "
    "Andrew Donna Kevin Michelle Brian Carol George Amanda Edward Melissa Ronald Deborah Timothy Laura Jason Rebecca "
    "Wei Li Ana Carlos Sofia Luis Maria Juan Yuki Hiroshi Fatima Ahmed Olga Ivan Priya Ravi Chen Mei Lucas Emma"
).split()
_LAST = (
    "Smith Johnson Williams Brown Jones Garcia Miller Davis Rodriguez Martinez Hernandez Lopez Gonzalez Wilson "
    "Anderson Thomas Taylor Moore Jackson Martin Lee Perez Thompson White Harris Sanchez Clark Ramirez Lewis Robinson "
    "Walker Young Allen King Wright Scott Torres Nguyen Hill Flores Green Adams Nelson Baker Hall Rivera Campbell"
).split()
_PLACES = (
    "France Germany Spain Italy Japan China India Brazil Canada Mexico Australia Egypt Kenya Norway Sweden Poland "
    "Netherlands Belgium Ireland Portugal Greece Turkey Russia Korea Argentina Chile Peru Colombia Nigeria Vietnam "
    "Paris London Berlin Madrid Rome Tokyo Beijing Delhi Toronto Sydney Chicago Boston Seattle Houston Denver Austin"
).split()
_MONTHS = "January February March April May June July August September October November December".split()
COMMON_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this from or had by not "
    "but what some we can out other were all there when up use your how said an each she which do their time if will "
    "way about many then them write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down side been now find any new "
    "work part take get place made live where after back little only round man year came show every good me give our "
    "under very through just form sentence great think say help low line differ turn cause much mean before move "
    "right boy old too same tell does set three want air well also play small end put home read hand large spell add "
    "even land here must big high such follow act why ask men change went light kind off need house picture try us "
    "again animal point mother world near build self earth father head stand own page should answer found study still "
    "learn plant cover food sun four between state keep eye never last let thought tree cross farm hard start might "
    "story saw far sea draw left late run while press close night real life few north open seem together next white "
    "children begin got walk example ease paper group always music those both mark often letter until mile river car "
    "feet care second enough plain girl usual young ready above ever red list though feel talk bird soon body dog "
    "family direct pose leave song measure door product black short numeral class wind question happen complete ship "
    "area half rock fire south problem piece told knew pass since top whole king space heard best hour better true "
    "during hundred five remember step early hold west ground interest reach fast verb sing listen six table travel "
    "less morning ten simple several toward war lay against pattern slow center love person money serve appear road "
    "map rain rule govern pull cold notice voice unit power town fine certain fly fall lead dark machine note wait "
    "plan figure star box noun field rest correct able pound done beauty drive stood contain front teach week final "
    "gave green quick develop ocean warm free minute strong special mind behind clear tail produce fact street inch "
    "multiply nothing course stay wheel full force blue object decide surface deep moon island foot system busy test "
    "record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate miss "
    "brought heat snow tire bring yes distant fill east paint among budget estimate query result token context "
    "evidence database schema column row value average maximum minimum count total sum distinct filter aggregate"
).split()
MORE_WORDS = (
    "able about above accept according account across action activity actually add address administration admit "
    "adult affect after again against agency agent agree agreement ahead allow almost alone along already although "
    "always American among amount analysis another anyone anything appear apply approach argue arm around arrive art "
    "article artist assume attack attention attorney audience authority available avoid away baby bad bag ball bank "
    "bar base beat beautiful because become bed behavior believe benefit beyond bill billion bit blood board born "
    "break brother business buy camera campaign cancer candidate capital career carry case catch cell central century "
    "certainly chair challenge chance character charge choice choose church citizen civil claim clearly coach "
    "collection college commercial community compare computer concern condition conference Congress consider "
    "consumer contain continue control cost couple cultural culture cup current customer cut data daughter dead deal "
    "death debate decade decision defense degree Democrat describe design despite detail determine development die "
    "difference different difficult dinner discover discuss discussion disease doctor dream drop economic economy "
    "edge education effect effort eight either election else employee energy enjoy enter entire environment "
    "environmental especially establish evening event everybody everyone everything evidence exactly executive exist "
    "expect experience expert explain face factor fail fear federal feeling fight film finally financial finish firm "
    "floor focus force foreign forget former forward friend future garden gas general generation girl glass goal "
    "government growth guess gun hair happy health hear heart heavy herself himself history hit hope hospital hot "
    "however huge human husband idea identify image imagine impact important improve include including increase "
    "indeed indicate individual industry information inside instead institution international interview investment "
    "involve issue itself job join key kitchen knowledge lawyer leader learn least legal likely listen local loss "
    "lot main maintain major majority manage management manager market marriage material matter maybe media medical "
    "meeting memory mention message method middle military million minute mission modern moment month movement "
    "movie nation national natural nature nearly necessary network news newspaper nice none nor nothing officer "
    "official oil once operation opportunity option order organization others outside owner pain parent participant "
    "particular particularly partner party patient pay peace per perform performance perhaps period personal phone "
    "physical player police policy political politics poor popular population position positive practice prepare "
    "present president pressure pretty prevent price private probably process professional professor program project "
    "property protect prove provide public purpose quality quickly quite race radio raise range rate rather reality "
    "realize reason receive recent recently recognize reduce reflect relate relationship religious remain remove "
    "report represent require research resource respond response responsibility return reveal rich rise risk role "
    "scene science scientist season seat section security seek sell send senior sense series serious service seven "
    "several sex shake share shoot shot shoulder sign significant similar since single sister site situation skill "
    "social society soldier somebody someone something sometimes son sort source speak specific spend sport staff "
    "stage standard statement stock stop strategy structure student stuff style subject success successful suddenly "
    "suffer suggest summer support sure table talk task tax teacher technology television term terms themselves "
    "theory thus today tonight total tough trade traditional training treat treatment trial trouble truth TV type "
    "understand unit university upon usually various victim view violence visit vote wall watch weapon wear whatever "
    "whether whom whose wide wife window within without woman worker worry yard yeah yet yourself zone percentage "
    "ratio median distribution frequency highest lowest largest smallest earliest latest oldest youngest most least "
    "compute calculate retrieve return display indicate identify among per each respectively corresponding "
    "associated belonging including excluding whose among whether without within across between greater fewer less"
).split()
_ACTIONS = ("inspect_schema", "estimate_query", "rewrite_query", "execute_query", "manage_evidence", "answer",
            "abstain")


def _plural(word: str) -> str:
    if word.endswith("y") and word[-2:-1] not in "aeiou":
        return word[:-1] + "ies"
    return word + ("es" if word.endswith(("s", "x", "ch", "sh")) else "s")


def _value(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randrange(0, 10 ** rng.randrange(1, 7)))
    if kind == 1:
        return f"{rng.uniform(0, 10000):.{rng.randrange(1, 4)}f}"
    if kind == 2:
        return f"'{rng.randrange(1950, 2026)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}'"
    if kind == 3:
        return f"'{rng.choice(_PLACES)}'"
    if kind == 4:
        return f"'{rng.choice(_FIRST)} {rng.choice(_LAST)}'"
    return f"'%{rng.choice(COMMON_WORDS)}%'"


def _identifier(entity: str, column: str, rng: random.Random) -> str:
    """A column identifier in one of the styles real benchmarks use (snake, Spider prefix, CamelCase, quoted)."""
    style = rng.randrange(6)
    if style == 0:
        return f"{entity}_{column}"
    if style == 1:
        return "".join(p.capitalize() for p in f"{entity}_{column}".split("_"))
    if style == 2:
        return f"`{column.replace('_', ' ').title()}`"
    return column


def _sql(rng: random.Random) -> str:
    t1, t2 = rng.sample(_ENTITIES, 2)
    c1, c2, c3 = (_identifier(rng.choice(_ENTITIES), c, rng) for c in rng.sample(_COLUMNS, 3))
    op = rng.choice(["=", ">", "<", ">=", "<=", "!=", "<>", "LIKE", "NOT LIKE"])
    agg = rng.choice(["COUNT(*)", f"AVG({c1})", f"SUM({c1})", f"MAX({c2})", f"MIN({c2})", f"COUNT(DISTINCT {c1})",
                      f"TOTAL({c1})", f"ROUND(AVG({c1}), 2)"])
    fn = rng.choice([f"LENGTH({c1})", f"SUBSTR({c1}, 1, 4)", f"COALESCE({c1}, 0)", f"IFNULL({c1}, '')",
                     f"LOWER({c1})", f"UPPER({c1})", f"REPLACE({c1}, ' ', '')", f"INSTR({c1}, 'a')", f"ABS({c1})",
                     f"DATE({c1})", f"STRFTIME('%Y', {c1})", f"JULIANDAY({c1}) - JULIANDAY({c2})",
                     f"IIF({c1} > 0, 1, 0)", f"CAST({c1} AS {rng.choice(['INTEGER', 'REAL', 'TEXT', 'NUMERIC'])})"])
    join = rng.choice(["JOIN", "INNER JOIN", "LEFT JOIN", "LEFT OUTER JOIN", "CROSS JOIN"])
    setop = rng.choice(["UNION", "UNION ALL", "INTERSECT", "EXCEPT"])
    forms = [
        f"SELECT {c1}, {c2} FROM {t1} WHERE {c3} {op} {_value(rng)}",
        f"SELECT {agg} FROM {t1} WHERE {c1} {op} {_value(rng)} AND {c2} IS NOT NULL",
        f"SELECT {c1} FROM {t1} WHERE {c2} = {_value(rng)} OR {c3} = {_value(rng)}",
        f"SELECT {c1}, {agg} FROM {t1} GROUP BY {c1} ORDER BY {agg} DESC LIMIT {rng.randrange(1, 20)}",
        f"SELECT T1.{c1} FROM {t1} AS T1 {join} {t2} AS T2 ON T1.{t2}_id = T2.id WHERE T2.{c2} = {_value(rng)}",
        f"SELECT DISTINCT {c1} FROM {t1} WHERE {c2} BETWEEN {rng.randrange(100)} AND {rng.randrange(100, 1000)}",
        f"SELECT {c1} FROM {t1} WHERE {c2} IN (SELECT {c2} FROM {t2} WHERE {c3} IS NOT NULL)",
        f"SELECT {c1} FROM {t1} WHERE NOT EXISTS (SELECT 1 FROM {t2} WHERE {t2}.{c2} = {t1}.{c2})",
        f"SELECT {c1}, CASE WHEN {c2} > {rng.randrange(100)} THEN 'high' ELSE 'low' END FROM {t1}",
        f"SELECT CAST(SUM({c1}) AS REAL) * 100 / COUNT(*) FROM {t1} WHERE {c2} {op} {_value(rng)}",
        f"SELECT {c1} FROM {t1} GROUP BY {c1} HAVING COUNT(*) > {rng.randrange(1, 10)}",
        f"SELECT {fn}, {agg} FROM {t1} GROUP BY 1 ORDER BY 2 DESC",
        f"SELECT {fn} FROM {t1} WHERE {fn} {op} {_value(rng)}",
        f"SELECT {c1} FROM {t1} {setop} SELECT {c1} FROM {t2}",
        f"SELECT {c1} FROM {t1} ORDER BY {c2} ASC LIMIT {rng.randrange(1, 100)} OFFSET {rng.randrange(0, 50)}",
        f"SELECT * FROM {t1} {join} {t2} ON {t1}.{c1} = {t2}.{c1} WHERE {t2}.{c1} IS NULL",
        f"WITH t AS (SELECT {c1}, {agg} AS n FROM {t1} GROUP BY {c1}) SELECT MAX(n) FROM t",
        f"CREATE TABLE {t1} ({t1}_id INTEGER PRIMARY KEY, {c1} TEXT, {c2} REAL, {c3} "
        f"{rng.choice(['INTEGER', 'NUMERIC', 'VARCHAR(255)', 'DATE'])}, FOREIGN KEY ({c3}) REFERENCES {t2}(id))",
        f"EXPLAIN QUERY PLAN SELECT {c1} FROM {t1} WHERE {c2} = {_value(rng)}",
    ]
    sql = rng.choice(forms)
    if rng.random() < 0.3:  # multi-line layout: clauses start lines
        for kw in ("FROM", "WHERE", "GROUP BY", "ORDER BY", "HAVING", "LIMIT", join, setop):
            sql = sql.replace(f" {kw} ", f"\n{kw} ")
    return sql.lower() if rng.random() < 0.3 else sql


def _question(rng: random.Random) -> str:
    e, e2 = rng.sample(_ENTITIES, 2)
    c, c2 = rng.sample(_COLUMNS, 2)
    n = rng.randrange(2, 50)
    name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    place, year = rng.choice(_PLACES), rng.randrange(1950, 2026)
    when = f"{rng.choice(_MONTHS)} {rng.randrange(1, 29)}, {year}"
    forms = [
        f"How many {_plural(e)} are there?",
        f"How many {_plural(e)} have a {c} greater than {n}?",
        f"What is the average {c} of {_plural(e)} from {place}?",
        f"List the names of {_plural(e)} whose {c} is {n}, ordered by {c2} descending.",
        f"Which {e} has the highest {c}?",
        f"Find the total {c} of all {_plural(e)} in {year}.",
        f"Show the {c} and {c2} of every {e} created after {when}.",
        f"What are the names of the top {n} {_plural(e)} by {c}?",
        f"For each {e2}, count the number of {_plural(e)}.",
        f"What is the {c} of the {e} named {name}?",
        f"Give me the percentage of {_plural(e)} in {place} with {c} below {n}.",
        f"Did {name} have more {_plural(e)} than any other {e2} in {year}?",
        f"Return the {c} of {_plural(e)} that are not associated with any {e2}.",
        f"When was the first {e} recorded in {place}, and what was its {c}?",
    ]
    q = rng.choice(forms)
    return q.lower() if rng.random() < 0.1 else q


def _tool_call(rng: random.Random) -> str:
    name = rng.choice(_ACTIONS)
    if name in ("estimate_query", "execute_query", "rewrite_query"):
        args: dict = {"sql": _sql(rng)}
    elif name == "manage_evidence":
        args = {"op": rng.choice(["archive", "compress", "discard", "restore"]), "ref": f"E{rng.randrange(1, 9)}"}
    elif name == "answer":
        kind = rng.choice(["scalar", "list", "ordered_list"])
        vals = [rng.randrange(1000)] if kind == "scalar" else [rng.choice(_FIRST) for _ in range(rng.randrange(2, 5))]
        args = {"kind": kind, "values": vals, "evidence": [f"E{rng.randrange(1, 9)}"]}
    elif name == "inspect_schema":
        args = {"tables": rng.sample(_ENTITIES, rng.randrange(1, 3))}
    else:
        args = {"reason": f"The budget does not allow reading all {_plural(rng.choice(_ENTITIES))}."}
    return json.dumps({"name": name, "arguments": args})


def _observation(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        cols = rng.sample(_COLUMNS, rng.randrange(1, 4))
        rows = [[_value(rng).strip("'%") for _ in cols] for _ in range(rng.randrange(1, 6))]
        return json.dumps({"ref": f"E{rng.randrange(1, 9)}", "columns": cols, "rows": rows,
                           "truncated": rng.random() < 0.3})
    if kind == 1:
        p50 = rng.randrange(1, 5000)
        return (f"Estimate: rows p50={p50} p95={p50 * rng.randrange(2, 9)}; result tokens p50={p50 * 3} "
                f"p95={p50 * 11}; VM steps p50={p50 * 97}. Warning: the p95 result tokens exceed the remaining "
                f"budget of {rng.randrange(10, 800)} tokens.")
    if kind == 2:
        return (f"Budget: context {rng.randrange(100, 11000)}/{rng.choice([2400, 3500, 6000, 11000])} tokens, "
                f"queries {rng.randrange(0, 8)}/{rng.choice([1, 2, 4, 8])}, result tokens {rng.randrange(800)}/"
                f"{rng.choice([80, 250, 800, 2500])}, VM steps {rng.randrange(10**6)}/{rng.choice([250000, 600000])}, "
                f"turns {rng.randrange(1, 14)}/{rng.choice([5, 7, 10, 14])}.")
    e = rng.choice(_ENTITIES)
    cols = ", ".join(c + " " + rng.choice(["INTEGER", "TEXT", "REAL"]) for c in rng.sample(_COLUMNS, 4))
    return f"Table {e}: {cols}; {rng.randrange(10, 10**6)} rows."


def _form(word: str, rng: random.Random) -> str:
    """An inflected or cased variant, so that common stems, suffixes and capitalized forms all get tokens."""
    r = rng.random()
    if r < 0.55 or not word.isalpha() or not word.islower():
        return word
    if r < 0.7:
        return _plural(word)
    if r < 0.8:
        return word.capitalize()
    if r < 0.88:
        return (word[:-1] if word.endswith("e") else word) + "ing"
    if r < 0.96:
        return (word[:-1] if word.endswith("e") else word) + "ed"
    return word.upper()


def _prose(rng: random.Random) -> str:
    words = [_form(rng.choice(COMMON_WORDS if rng.random() < 0.6 else MORE_WORDS), rng)
             for _ in range(rng.randrange(6, 18))]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", "?", "!", ":", ";"])


def _instructions(rng: random.Random) -> str:
    """The fixed texts of the chat template's tools block, with one action's schema (they open every prompt)."""
    name = rng.choice(_ACTIONS)
    schema = {"type": "function", "function": {"name": name, "description": f"Run the {name.replace('_', ' ')} "
              "action of the budgeted SQL environment.", "parameters": {"type": "object", "properties": {
                  "sql": {"type": "string", "description": "A single read-only SQLite SELECT statement."}},
                  "required": ["sql"]}}}
    return (f"system\n{DEFAULT_SYSTEM}\n\n# Tools\n\n"
            "You may call one or more functions to assist with the user query.\n\n"
            f"You are provided with function signatures within XML tags:\n{json.dumps(schema)}\n\n"
            "For each function call, return a json object with function name and arguments within XML tags:\n"
            '{"name": <function-name>, "arguments": <args-json-object>}')


def _chat_piece(rng: random.Random) -> str:
    """Text between special tokens of a rendered conversation (role headers, tool-call and tool-response bodies)."""
    kind = rng.randrange(4)
    if kind == 0:
        return "user\n" + _question(rng)
    if kind == 1:
        return "assistant\n" + _prose(rng)
    if kind == 2:
        return "\n" + _tool_call(rng) + "\n"
    return "\n" + _observation(rng) + "\n"


def corpus_lines(scale: float = 1.0, seed: int = 0) -> Iterator[str]:
    """Yield the deterministic training corpus: ``round(60_000 * scale)`` mixed lines (SQL, questions, tool-call
    JSON, observations, English prose). Same ``(scale, seed)`` → same lines."""
    rng = random.Random(seed)
    makers = (_sql, _sql, _sql, _question, _question, _tool_call, _observation, _prose, _prose, _instructions,
              _chat_piece, _chat_piece)
    yield from SQL_KEYWORDS  # each keyword is seen at least once on its own
    for _ in range(max(1, round(60_000 * scale))):
        yield rng.choice(makers)(rng)
