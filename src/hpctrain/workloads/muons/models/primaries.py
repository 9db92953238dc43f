"""Primaries as the muon sampler takes them: named columns with units, or a plain array in the one documented
order, checked either way (a cosine entered as a zenith gave 3.1 muons per event instead of 14.2, silently).

Columns, from a dict of arrays, a pandas DataFrame, a NumPy structured array or a pyarrow Table (and, for
`hpctrain sample --primaries`, a CSV or Parquet file of them):

    energy_GeV   the primary's energy in GeV (> 0)
    zenith_rad   its zenith angle in radians, 0 (vertical) to pi/2; or cos_zenith, its cosine, 0 to 1
    mass_GeV     its mass in GeV (> 0; proton 0.938, iron 52.1)
    depth_m      the detector's depth in metres (> 0)

Other columns are ignored. A plain (n, 4) array (or list, or tensor) holds them in that order: energy_GeV,
zenith_rad, mass_GeV, depth_m. Any value out of range is one UserError line naming the row and the column.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from hpctrain.errors import UserError

COLUMNS = ("energy_GeV", "zenith_rad", "mass_GeV", "depth_m")
COS_ZENITH = "cos_zenith"
ORDER = "(energy_GeV, zenith_rad, mass_GeV, depth_m)"
HALF_PI = np.pi / 2
TABLE_SUFFIXES = (".csv", ".parquet", ".pq", ".parq")


def named_columns(given: Any) -> list[str] | None:
    """The column names of a named form (dict, DataFrame, structured array, pyarrow Table), None for a plain
    array."""
    if isinstance(given, np.ndarray):
        return list(given.dtype.names) if given.dtype.names else None
    if isinstance(given, Mapping):
        return [str(k) for k in given]
    names = getattr(given, "column_names", None)  # pyarrow Table / RecordBatch
    if names is None and hasattr(given, "columns") and hasattr(given, "__getitem__"):  # pandas DataFrame
        names = list(given.columns)
    return [str(n) for n in names] if names is not None else None


def as_primaries(given: Any, what: str = "primaries", first_row: int = 0) -> np.ndarray:
    """(n, 4) float32 physical primaries [energy GeV, zenith rad, mass GeV, depth m] from named columns or a
    plain array in that order (module docstring), every value checked (`what` names them in an error, their
    rows counted from `first_row`)."""
    names = named_columns(given)
    if names is None:
        try:
            plain = np.asarray(given, dtype=np.float64)
        except (TypeError, ValueError):
            raise UserError(
                f"{what}: not numbers; give named columns {', '.join(COLUMNS)} or an (n, 4) array {ORDER}"
            ) from None
        if plain.ndim == 1 and plain.shape[0] == 4:
            plain = plain[None, :]  # one primary
        if plain.ndim != 2 or plain.shape[1] != 4:
            raise UserError(f"{what}: an array of shape {plain.shape}; expected (n, 4) columns {ORDER}")
        return check(plain, what, named=False, first_row=first_row)
    return check(_from_columns(given, names, what, first_row), what, named=True, first_row=first_row)


def _from_columns(given: Any, names: list[str], what: str, first_row: int) -> np.ndarray:
    zenith_forms = [n for n in ("zenith_rad", COS_ZENITH) if n in names]
    missing = [n for n in COLUMNS if n != "zenith_rad" and n not in names] + (
        [] if zenith_forms else ["zenith_rad"]
    )
    if missing:
        raise UserError(
            f"{what}: no column {', '.join(missing)} (the columns, with their units: energy_GeV, zenith_rad or "
            f"cos_zenith, mass_GeV, depth_m; given: {', '.join(names[:12]) or 'none'})"
        )
    if len(zenith_forms) == 2:
        raise UserError(f"{what}: both zenith_rad and cos_zenith given; give one")

    def column(name: str) -> np.ndarray:
        try:
            values = np.asarray(given[name], dtype=np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise UserError(f"{what}: column {name} holds values that are not numbers") from None
        return values

    energy, mass, depth = column("energy_GeV"), column("mass_GeV"), column("depth_m")
    if zenith_forms == [COS_ZENITH]:
        cos = column(COS_ZENITH)
        bad = ~((cos >= 0.0) & (cos <= 1.0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise UserError(
                f"{what} row {first_row + row}: cos_zenith {cos[row]:g} is outside [0, 1] (1: vertical){_more(bad)}"
            )
        zenith = np.arccos(cos)
    else:
        zenith = column("zenith_rad")
    lengths = {len(energy), len(zenith), len(mass), len(depth)}
    if len(lengths) != 1:
        raise UserError(f"{what}: columns of different lengths ({sorted(lengths)})")
    return np.stack([energy, zenith, mass, depth], axis=1)


def check(primaries: np.ndarray, what: str, named: bool = True, first_row: int = 0) -> np.ndarray:
    """`primaries` (n, 4) physical as float32, each value checked: finite, a positive energy, mass and depth,
    a zenith in [0, pi/2]. The first bad row is one UserError line (with how many more there are)."""
    values = np.asarray(primaries, dtype=np.float64)
    hint = (
        ""
        if named
        else f"; a plain array's columns are {ORDER}, or give named columns (cos_zenith for a cosine)"
    )
    finite = np.isfinite(values)
    zenith = values[:, 1]
    tests: list[tuple[np.ndarray, int | None, str]] = [
        (~np.all(finite, axis=1), None, "is not finite"),
        (values[:, 0] <= 0, 0, "is not positive (GeV)"),
        ((zenith < 0) | (zenith > HALF_PI), 1, "is outside [0, pi/2] (radians; 0 is vertical)"),
        (values[:, 2] <= 0, 2, "is not positive (GeV)"),
        (values[:, 3] <= 0, 3, "is not positive (m)"),
    ]
    for bad, col, why in tests:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            c = col if col is not None else int(np.flatnonzero(~finite[row])[0])
            raise UserError(
                f"{what} row {first_row + row}: {COLUMNS[c]} {values[row, c]:g} {why}{_more(bad)}{hint}"
            )
    return values.astype(np.float32)


def _more(bad: np.ndarray) -> str:
    n = int(bad.sum())
    return f" (and {n - 1} more row(s))" if n > 1 else ""


def is_table(path: str) -> bool:
    """Whether `path` is a table of named primaries (CSV, or Parquet with an energy_GeV column) rather than a
    muon file."""
    if path.lower().endswith(".csv"):
        return True
    if not path.lower().endswith(TABLE_SUFFIXES):
        return False
    try:
        return "energy_GeV" in pq.read_schema(path).names
    except Exception:  # not Parquet at all: the muon file readers say what it is
        return False


def table_chunks(path: str, chunk: int) -> Iterator[np.ndarray]:
    """The checked primaries of a CSV or Parquet table of named columns, `chunk` rows at a time."""
    try:
        if path.lower().endswith(".csv"):
            batches: Any = pacsv.read_csv(path).to_batches(max_chunksize=chunk)
        else:
            batches = pq.ParquetFile(path).iter_batches(batch_size=chunk)
        start = 0
        for batch in batches:
            rows = as_primaries(pa.Table.from_batches([batch]), path, start)
            yield rows
            start += len(rows)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(
            f"{path}: cannot be read as a table of primaries ({str(exc).splitlines()[0][:200]})"
        ) from None
