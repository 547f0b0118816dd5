"""Answers read as `output_schema` JSON: one typed column per field, or the row's error.

Decoding is constrained to the schema, yet an answer can still fail to read: the grammar
cannot finish an object that max_tokens cut off (finish_reason "length"), and ranges the schema
leaves out (an INT past 2^31, a DECIMAL's precision) are checked only here. Such a row keeps
its text, gets null typed fields and an `error` that says why; the job never fails for it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from vllm_fleet.spark.rows import RowResult

_DECIMALS = decimal.Context(prec=80, rounding=decimal.ROUND_HALF_EVEN)
_INT_BITS = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}


class OutputParseError(ValueError):
    """The answer text is not a JSON value of the output schema; the message says where."""


def decode(text: str, struct: T.StructType) -> dict[str, Any]:
    """The field values of one answer, as Python values Arrow takes for the struct's types."""
    try:
        value = json.loads(text, parse_float=decimal.Decimal)  # exact digits for DECIMAL fields
    except json.JSONDecodeError as exc:
        raise OutputParseError(f"not JSON ({exc.msg} at character {exc.pos})") from None
    return _convert(value, struct, "$")


def _convert(value: Any, dtype: T.DataType, path: str) -> Any:
    if value is None:
        raise OutputParseError(f"{path} is null")
    if isinstance(dtype, T.StructType):
        return _struct(value, dtype, path)
    if isinstance(dtype, T.ArrayType):
        _expect(isinstance(value, list), value, "an array", path)
        return [_convert(item, dtype.elementType, f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(dtype, T.MapType):
        _expect(isinstance(value, dict), value, "an object", path)
        return [(key, _convert(item, dtype.valueType, f"{path}.{key}")) for key, item in value.items()]
    if isinstance(dtype, T.StringType):
        _expect(isinstance(value, str), value, "a string", path)
        return value
    if isinstance(dtype, T.BooleanType):
        _expect(isinstance(value, bool), value, "true or false", path)
        return value
    if type(dtype) in _INT_BITS:
        return _integer(value, _INT_BITS[type(dtype)], path)
    if isinstance(dtype, T.DecimalType):
        return _decimal(value, dtype, path)
    if isinstance(dtype, (T.FloatType, T.DoubleType)):
        _expect(_is_number(value), value, "a number", path)
        return float(value)
    if isinstance(dtype, (T.DateType, T.TimestampType, T.TimestampNTZType)):
        return _datetime(value, dtype, path)
    raise OutputParseError(f"{path}: {dtype.simpleString()} is not an output type")  # output_schema refused it


def _struct(value: Any, struct: T.StructType, path: str) -> dict[str, Any]:
    _expect(isinstance(value, dict), value, "an object", path)
    missing = [f.name for f in struct.fields if f.name not in value]
    if missing:
        raise OutputParseError(f"{path} has no {', '.join(missing)}")
    extra = sorted(set(value) - set(struct.names))
    if extra:
        raise OutputParseError(f"{path} has field(s) the schema does not: {', '.join(extra)}")
    return {f.name: _convert(value[f.name], f.dataType, f"{path}.{f.name}") for f in struct.fields}


def _integer(value: Any, bits: int, path: str) -> int:
    if isinstance(value, decimal.Decimal) and value == value.to_integral_value():
        value = int(value)  # 30.0 is the integer 30 in JSON schema
    _expect(isinstance(value, int) and not isinstance(value, bool), value, "an integer", path)
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not low <= value <= high:
        raise OutputParseError(f"{path} is {value}, outside the {bits}-bit integer range")
    return value


def _decimal(value: Any, dtype: T.DecimalType, path: str) -> decimal.Decimal:
    _expect(_is_number(value), value, "a number", path)
    # Spark's decimals hold up to 38 digits, more than decimal's default context (28).
    exact = decimal.Decimal(value).quantize(decimal.Decimal(1).scaleb(-dtype.scale), context=_DECIMALS)
    if len(exact.as_tuple().digits) > dtype.precision:
        raise OutputParseError(f"{path} is {value}, too many digits for {dtype.simpleString()}")
    return exact


def _datetime(value: Any, dtype: T.DataType, path: str) -> dt.date | dt.datetime:
    what = "date" if isinstance(dtype, T.DateType) else "date-time"
    _expect(isinstance(value, str), value, f"a {what} string", path)
    try:
        if isinstance(dtype, T.DateType):
            return dt.date.fromisoformat(value)
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        raise OutputParseError(f"{path} is {value!r}, not an ISO 8601 {what}") from None
    if isinstance(dtype, T.TimestampNTZType):
        return moment.replace(tzinfo=None)
    # TIMESTAMP is an instant: a time without an offset is read as UTC.
    return moment.astimezone(dt.timezone.utc) if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, decimal.Decimal)) and not isinstance(value, bool)


def _expect(ok: bool, value: Any, what: str, path: str) -> None:
    if not ok:
        shown = json.dumps(value, default=str)
        raise OutputParseError(f"{path} is {shown[:60]}{'...' if len(shown) > 60 else ''}, not {what}")


def row_values(result: RowResult, struct: T.StructType) -> dict[str, Any] | None:
    """The typed values of one answered row, or None; a row that does not read gets its error."""
    if result.error is not None or result.output is None:
        return None
    try:
        return decode(result.output, struct)
    except OutputParseError as exc:
        cut = " (the answer was cut off at max_tokens; raise max_tokens)" if result.finish_reason == "length" else ""
        result.error = f"output is not valid JSON for the schema: {exc}{cut}"
        return None


def typed_arrays(results: list[RowResult], struct: T.StructType) -> list[pa.Array]:
    """One Arrow column per field of `struct`, null where a row has no values. Sets `error` on
    rows whose answer does not read, so call it before the error column is built."""
    rows = [row_values(result, struct) for result in results]
    # TIMESTAMP values are UTC instants (see _datetime); Spark shows them in the session's zone.
    return [pa.array([None if row is None else row[f.name] for row in rows],
                     to_arrow_type(f.dataType, timezone="UTC")) for f in struct.fields]
