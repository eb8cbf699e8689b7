//! Resource limits: what a request may ask for, the operator's defaults and maxima, and the
//! check that turns one into the other before anything is started.
//!
//! Every limit is declared once, in the [`limits!`] table below: its name on the wire (the
//! same in requests, verdicts, `/v1/runtimes`, the TOML configuration, OpenAPI and the MCP
//! schemas), the kind of value it takes, its default and its minimum. Everything else (the
//! request and verdict fields, parsing from JSON, TOML and the command line, the schemas, the
//! range check) is generated from that table, so adding a limit is one entry here plus the
//! place in the engine that enforces it.
//!
//! Values have one wire form in both directions, so a verdict's `limits` can be sent back as
//! a request: durations are seconds (a number; requests may also say `"500ms"`, `"2m"`),
//! sizes are bytes (a whole number; requests may also say `"256M"`, `"1G"`), CPU is cores (a
//! number, may be fractional), counts are whole numbers.

use std::fmt;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{json, Value};

use crate::units::{format_duration, format_size, parse_duration, parse_size};

/// The kind of value a limit takes; it fixes the wire form and the unit of the raw value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Raw unit: milliseconds. Wire: seconds, or a string with a unit.
    Time,
    /// Raw unit: bytes. Wire: bytes, or a string with a unit.
    Bytes,
    /// Raw unit: thousandths of a core. Wire: cores, may be fractional.
    Cores,
    /// Raw unit: one. Wire: a whole number.
    Count,
}

/// A duration limit, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millis(pub u64);
/// A size limit, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);
/// A CPU limit, in thousandths of a core (1000 = one full core).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MilliCpus(pub u64);
/// A count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Count(pub u64);

impl Millis {
    pub const fn secs(s: u64) -> Millis {
        Millis(s * 1000)
    }
    pub fn duration(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

/// The raw value of a limit and the kind that says its unit.
trait Raw: Copy {
    const KIND: Kind;
    fn raw(self) -> u64;
    fn from_raw(raw: u64) -> Self;
}

macro_rules! raw {
    ($($ty:ident => $kind:ident),*) => {$(
        impl Raw for $ty {
            const KIND: Kind = Kind::$kind;
            fn raw(self) -> u64 {
                self.0
            }
            fn from_raw(raw: u64) -> Self {
                $ty(raw)
            }
        }
    )*};
}
raw!(Millis => Time, Bytes => Bytes, MilliCpus => Cores, Count => Count);

impl Kind {
    /// A raw value in words: "30 s", "256 MiB", "0.5 CPU", "64".
    pub fn describe(self, raw: u64) -> String {
        match self {
            Kind::Time => format_duration(Duration::from_millis(raw)),
            Kind::Bytes => format_size(raw),
            Kind::Cores => format!("{} CPU", raw as f64 / 1000.0),
            Kind::Count => raw.to_string(),
        }
    }

    /// A raw value in its wire form: seconds, bytes, cores or a count.
    pub fn to_wire(self, raw: u64) -> Value {
        match self {
            Kind::Time | Kind::Cores if raw.is_multiple_of(1000) => json!(raw / 1000),
            Kind::Time | Kind::Cores => json!(raw as f64 / 1000.0),
            Kind::Bytes | Kind::Count => json!(raw),
        }
    }

    /// A value as the command line and the configuration write it: `10s`, `0.5`, `256M`, `64`.
    pub fn parse_text(self, text: &str) -> Result<u64, String> {
        let t = text.trim();
        match self {
            Kind::Time => parse_duration(t).map(|d| d.as_millis().min(u64::MAX as u128) as u64),
            Kind::Bytes => parse_size(t),
            Kind::Cores => match t.parse::<f64>() {
                Ok(c) => cores_to_raw(c).ok_or(()),
                Err(_) => Err(()),
            }
            .map_err(|()| format!("'{text}' is not a positive number of cores")),
            Kind::Count => t
                .parse::<u64>()
                .map_err(|_| format!("'{text}' is not a whole number ≥ 0")),
        }
    }

    /// What a request may send for a limit of this kind (JSON Schema, also valid OpenAPI 3.1).
    pub(crate) fn request_schema(self, doc: &str) -> Value {
        // What `units::parse_duration` and `units::parse_size` read.
        // Blanks as `str::trim` strips them and every regex engine reads them alike (`\s`
        // differs between Python's and ECMA's).
        const DURATION_PATTERN: &str = r"^[\t\n\x0b\x0c\r ]*([0-9]+\.?[0-9]*|\.[0-9]+)[\t\n\x0b\x0c\r ]*(ms|s|sec|m|min|h)?[\t\n\x0b\x0c\r ]*$";
        const SIZE_PATTERN: &str = r"^[\t\n\x0b\x0c\r ]*([0-9]+\.?[0-9]*|\.[0-9]+)[\t\n\x0b\x0c\r ]*([bB]([yY][tT][eE][sS]?)?|[kKmMgGtT]([iI]?[bB])?)?[\t\n\x0b\x0c\r ]*$";
        match self {
            Kind::Time => json!({
                "description": format!("{doc} Seconds (a number), or a string with a unit: ms, s, m, h (\"500ms\", \"2m\")."),
                "oneOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": DURATION_PATTERN, "examples": ["500ms", "10s", "2m"]},
                    {"type": "null"}
                ]
            }),
            Kind::Bytes => json!({
                "description": format!("{doc} Bytes (a whole number), or a string with a unit: K, M, G, T, powers of 1024 (\"256M\", \"1G\")."),
                "oneOf": [
                    {"type": "integer", "minimum": 0},
                    {"type": "string", "pattern": SIZE_PATTERN, "examples": ["64K", "256M", "1G"]},
                    {"type": "null"}
                ]
            }),
            Kind::Cores => json!({
                "description": format!("{doc} CPU cores, may be fractional (0.5)."),
                "type": ["number", "null"],
                "exclusiveMinimum": 0
            }),
            Kind::Count => json!({
                "description": doc,
                "type": ["integer", "null"],
                "minimum": 0
            }),
        }
    }

    /// How a verdict reports a limit of this kind.
    fn output_schema(self, doc: &str) -> Value {
        match self {
            Kind::Time => {
                json!({"description": format!("{doc} Seconds."), "type": "number", "minimum": 0})
            }
            Kind::Bytes => {
                json!({"description": format!("{doc} Bytes."), "type": "integer", "minimum": 0})
            }
            Kind::Cores => {
                json!({"description": format!("{doc} CPU cores."), "type": "number", "minimum": 0})
            }
            Kind::Count => json!({"description": doc, "type": "integer", "minimum": 0}),
        }
    }

    /// The message for a JSON value that cannot be a limit of this kind at all.
    fn expecting(self, name: &str) -> String {
        match self {
            Kind::Time => format!(
                "{name} must be a number of seconds (e.g. 10 or 0.5) or a string with a unit (e.g. \"500ms\", \"2m\")"
            ),
            Kind::Bytes => format!(
                "{name} must be a whole number of bytes or a string with a unit (e.g. \"256M\", \"1G\")"
            ),
            Kind::Cores => format!("{name} must be a positive number of cores"),
            Kind::Count => format!("{name} must be a whole number"),
        }
    }
}

/// Cores as thousandths, for any positive finite number: a huge one saturates (`as` does) and
/// the policy then names the maximum, as for every other limit.
fn cores_to_raw(c: f64) -> Option<u64> {
    (c.is_finite() && c > 0.0).then(|| (c * 1000.0).round().max(1.0) as u64)
}

/// When a limit takes effect, which decides where a request may set it and which warm
/// sandbox can serve it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Fixed when the sandbox (or its interpreter) is built: its cgroup, its scratch disk, the
    /// interpreter's rlimits. A warm sandbox serves a request only when every such limit is
    /// the one it was built with, and a call in a session cannot change it.
    Sandbox,
    /// Applied to each program (or session call) anew: its clocks and its output caps.
    Program,
}

/// Declares every limit. Each entry: doc comment, enum variant, field name (the wire name),
/// value type, the name verdicts used before the names were unified (still written, for one
/// release), the default, the minimum and its [`Scope`]. See the module documentation.
macro_rules! limits {
    ($(
        $(#[doc = $doc:literal])+
        $variant:ident $field:ident: $ty:ident, legacy $legacy:literal,
            default $default:expr, minimum $min:expr, $scope:ident;
    )+) => {
        /// One limit of a run.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Limit {
            $($(#[doc = $doc])+ $variant),+
        }

        impl Limit {
            /// Every limit, in the order documentation lists them.
            pub const ALL: &'static [Limit] = &[$(Limit::$variant),+];

            /// The name in requests, verdicts, the configuration and the schemas.
            pub fn name(self) -> &'static str {
                match self { $(Limit::$variant => stringify!($field)),+ }
            }

            /// The name verdicts and `/v1/runtimes` used before (`timeout_ms`, ...); still
            /// written next to the new one for one release.
            pub fn legacy_name(self) -> &'static str {
                match self { $(Limit::$variant => $legacy),+ }
            }

            pub fn kind(self) -> Kind {
                match self { $(Limit::$variant => <$ty as Raw>::KIND),+ }
            }

            /// What the limit bounds, in one sentence.
            pub fn doc(self) -> &'static str {
                match self { $(Limit::$variant => concat!($($doc),+).trim_ascii()),+ }
            }

            pub fn from_name(name: &str) -> Option<Limit> {
                match name { $(stringify!($field) => Some(Limit::$variant),)+ _ => None }
            }

            /// When the limit takes effect.
            pub fn scope(self) -> Scope {
                match self { $(Limit::$variant => Scope::$scope),+ }
            }
        }

        /// The wire names, for serde's `deserialize_struct` (a flattened struct takes only
        /// these).
        const NAMES: &[&str] = &[$(stringify!($field)),+];

        /// The limits one run gets.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct Limits {
            $($(#[doc = $doc])+ pub $field: $ty,)+
        }

        impl Limits {
            /// runcell's defaults.
            pub const DEFAULT: Limits = Limits { $($field: $default),+ };
            /// The smallest values that still let a runtime start.
            pub const MINIMUM: Limits = Limits { $($field: $min),+ };

            /// A limit's raw value (its unit is its kind's).
            pub fn get(&self, limit: Limit) -> u64 {
                match limit { $(Limit::$variant => self.$field.raw()),+ }
            }

            pub fn set(&mut self, limit: Limit, raw: u64) {
                match limit { $(Limit::$variant => self.$field = <$ty as Raw>::from_raw(raw)),+ }
            }
        }

        /// Limits a request asks for; each left out falls back to the operator's default.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct LimitOverrides {
            $($(#[doc = $doc])+ pub $field: Option<$ty>,)+
        }

        impl LimitOverrides {
            pub fn get(&self, limit: Limit) -> Option<u64> {
                match limit { $(Limit::$variant => self.$field.map(Raw::raw)),+ }
            }

            pub fn set(&mut self, limit: Limit, raw: Option<u64>) {
                match limit { $(Limit::$variant => self.$field = raw.map(<$ty as Raw>::from_raw)),+ }
            }
        }
    };
}

limits! {
    /// Wall-clock time of the program.
    Timeout timeout: Millis, legacy "timeout_ms",
        default Millis::secs(30), minimum Millis(10), Program;
    /// Wall-clock time of the compile step (Go).
    CompileTimeout compile_timeout: Millis, legacy "compile_timeout_ms",
        default Millis::secs(60), minimum Millis(100), Program;
    /// Memory, swap included.
    Memory memory: Bytes, legacy "memory_bytes",
        default Bytes(256 << 20), minimum Bytes(16 << 20), Sandbox;
    /// CPU bandwidth.
    Cpus cpus: MilliCpus, legacy "cpu_millis",
        default MilliCpus(1000), minimum MilliCpus(10), Sandbox;
    /// Processes and threads.
    Pids pids: Count, legacy "pids",
        default Count(64), minimum Count(1), Sandbox;
    /// Disk space of /tmp, /workspace and /dev/shm together.
    Disk disk: Bytes, legacy "disk_bytes",
        default Bytes(64 << 20), minimum Bytes(1 << 20), Sandbox;
    /// Cap of each of stdout and stderr.
    Output output: Bytes, legacy "output_bytes",
        default Bytes(1 << 20), minimum Bytes(1), Program;
    /// Open file descriptors per process.
    OpenFiles open_files: Count, legacy "open_files",
        default Count(1024), minimum Count(16), Sandbox;
    /// Output files returned in the verdict's `files`; the rest are counted in
    /// `files_omitted`.
    OutputFiles output_files: Count, legacy "output_files",
        default Count(100), minimum Count(0), Program;
    /// Bytes per second read from the host's disk (the host files a run reads that are not
    /// in the page cache). The default depends on the disk.
    IoRead io_read: Bytes, legacy "io_read",
        default Bytes(256 << 20), minimum Bytes(1 << 20), Sandbox;
    /// Bytes per second written to the host's disk.
    IoWrite io_write: Bytes, legacy "io_write",
        default Bytes(128 << 20), minimum Bytes(1 << 20), Sandbox;
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The limits' names, as requests and the configuration spell them: "timeout, memory, ...".
pub fn limit_names() -> String {
    Limit::ALL
        .iter()
        .map(|l| l.name())
        .collect::<Vec<_>>()
        .join(", ")
}

impl Limits {
    pub fn timeout(&self) -> Duration {
        self.timeout.duration()
    }

    pub fn compile_timeout(&self) -> Duration {
        self.compile_timeout.duration()
    }

    /// RLIMIT_CPU (soft) for a phase with this timeout: a backstop behind the wall clock, the
    /// CPU seconds the program could burn at its CPU share over the whole timeout, plus one.
    pub fn cpu_rlimit_seconds(&self, timeout: Duration) -> u64 {
        (timeout.as_secs_f64() * (self.cpus.0 as f64 / 1000.0).max(1.0)).ceil() as u64 + 1
    }

    /// The limits in their wire form, keyed by name (no legacy names).
    pub fn to_wire(&self) -> serde_json::Map<String, Value> {
        Limit::ALL
            .iter()
            .map(|&l| (l.name().to_string(), l.kind().to_wire(self.get(l))))
            .collect()
    }
}

/// Written with the wire names, and (for one release) also with the names verdicts used
/// before: `timeout_ms`, `memory_bytes`, `cpu_millis`, ... in their raw units.
impl Serialize for Limits {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for &l in Limit::ALL {
            map.serialize_entry(l.name(), &l.kind().to_wire(self.get(l)))?;
        }
        for &l in Limit::ALL {
            if l.legacy_name() != l.name() {
                map.serialize_entry(l.legacy_name(), &self.get(l))?;
            }
        }
        map.end()
    }
}

/// Every limit must be present; legacy names are ignored (they repeat the new ones).
impl<'de> Deserialize<'de> for Limits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let o = d.deserialize_map(OverridesVisitor {
            ignore_legacy: true,
        })?;
        let mut l = Limits::DEFAULT;
        for &limit in Limit::ALL {
            let raw = o
                .get(limit)
                .ok_or_else(|| de::Error::missing_field(limit.name()))?;
            l.set(limit, raw);
        }
        Ok(l)
    }
}

impl Serialize for LimitOverrides {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        for &l in Limit::ALL {
            if let Some(raw) = self.get(l) {
                map.serialize_entry(l.name(), &l.kind().to_wire(raw))?;
            }
        }
        map.end()
    }
}

/// Each limit's value as its kind allows (see the module documentation); `null` is "not
/// asked". Unknown names are an error. When a request is deserialized, the request's own
/// fields are taken first (the limits are flattened into it).
impl<'de> Deserialize<'de> for LimitOverrides {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct(
            "LimitOverrides",
            NAMES,
            OverridesVisitor {
                ignore_legacy: false,
            },
        )
    }
}

struct OverridesVisitor {
    ignore_legacy: bool,
}

impl<'de> Visitor<'de> for OverridesVisitor {
    type Value = LimitOverrides;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limits ({})", limit_names())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LimitOverrides, A::Error> {
        let mut limits = LimitsBuilder::default();
        while let Some(key) = map.next_key::<String>()? {
            match Limit::from_name(&key) {
                Some(limit) => limits.next_value(limit, &mut map)?,
                None if self.ignore_legacy => {
                    map.next_value::<de::IgnoredAny>()?;
                }
                None => return Err(de::Error::unknown_field(&key, NAMES)),
            }
        }
        Ok(limits.finish())
    }
}

/// Limits read from a map one key at a time (a request's own map, or a limits object): each
/// limit at most once, also when its first value was `null`.
#[derive(Debug, Default)]
pub(crate) struct LimitsBuilder {
    limits: LimitOverrides,
    seen: Vec<Limit>,
}

impl LimitsBuilder {
    /// Read the value of `limit`, whose key `map` has just given.
    pub(crate) fn next_value<'de, A: MapAccess<'de>>(
        &mut self,
        limit: Limit,
        map: &mut A,
    ) -> Result<(), A::Error> {
        if self.seen.contains(&limit) {
            return Err(de::Error::duplicate_field(limit.name()));
        }
        self.seen.push(limit);
        let raw = map.next_value_seed(ValueSeed(limit))?;
        self.limits.set(limit, raw);
        Ok(())
    }

    pub(crate) fn finish(self) -> LimitOverrides {
        self.limits
    }
}

/// One limit's value from JSON or TOML, with messages that name the limit.
struct ValueSeed(Limit);

impl<'de> DeserializeSeed<'de> for ValueSeed {
    type Value = Option<u64>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(ValueVisitor(self.0))
    }
}

struct ValueVisitor(Limit);

impl ValueVisitor {
    /// "pids must be a whole number, not -1".
    fn bad<E: de::Error>(&self, got: impl fmt::Display) -> E {
        E::custom(format!(
            "{}, not {got}",
            self.0.kind().expecting(self.0.name())
        ))
    }
}

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.kind().expecting(self.0.name()))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Option<u64>, E> {
        match self.0.kind() {
            // Seconds; `as` saturates, and the policy then names the maximum.
            Kind::Time => Ok(Some(v.saturating_mul(1000))),
            Kind::Bytes | Kind::Count => Ok(Some(v)),
            Kind::Cores => cores_to_raw(v as f64).map(Some).ok_or_else(|| self.bad(v)),
        }
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Option<u64>, E> {
        match u64::try_from(v) {
            Ok(v) => self.visit_u64(v),
            Err(_) => Err(self.bad(v)),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Option<u64>, E> {
        match self.0.kind() {
            Kind::Time if v.is_finite() && v >= 0.0 => Ok(Some((v * 1000.0).round() as u64)),
            Kind::Cores => cores_to_raw(v).map(Some).ok_or_else(|| self.bad(v)),
            // A whole number written as a float (Python's json.dumps(64.0) is "64.0", and JSON
            // Schema's "integer" includes it) is that number.
            Kind::Bytes | Kind::Count
                if v.fract() == 0.0 && (0.0..u64::MAX as f64).contains(&v) =>
            {
                Ok(Some(v as u64))
            }
            // Sizes and counts are whole numbers: 1.5 bytes is a mistake, not a rounding. The
            // value is shown as it was sent (`{v:?}`: 1e300, not three hundred digits).
            _ => Err(self.bad(format_args!("{v:?}"))),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Option<u64>, E> {
        match self.0.kind() {
            Kind::Time | Kind::Bytes => self
                .0
                .kind()
                .parse_text(v)
                .map(Some)
                .map_err(|e| E::custom(format!("{}: {e}", self.0.name()))),
            // A count or a number of cores is a JSON number: "2" is a mistake worth naming.
            Kind::Cores | Kind::Count => Err(self.bad(format_args!("the string {v:?}"))),
        }
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Option<u64>, E> {
        Err(self.bad(v))
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<Option<u64>, A::Error> {
        Err(self.bad("a list"))
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Option<u64>, A::Error> {
        Err(self.bad("an object"))
    }
}

impl LimitOverrides {
    /// Set a limit from the text of a flag or a `NAME=VALUE` setting (`10s`, `256M`, `0.5`).
    pub fn set_text(&mut self, limit: Limit, text: &str) -> Result<(), String> {
        let raw = limit.kind().parse_text(text)?;
        self.set(limit, Some(raw));
        Ok(())
    }

    /// Overrides on top of `base`.
    pub fn apply_to(&self, base: Limits) -> Limits {
        let mut l = base;
        for &limit in Limit::ALL {
            if let Some(raw) = self.get(limit) {
                l.set(limit, raw);
            }
        }
        l
    }

    /// The limits asked for in their wire form, and (for one release) under the names verdicts
    /// used before in their raw units: for logs that keep their format, like the audit log.
    pub fn to_wire_with_legacy(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        for &l in Limit::ALL {
            if let Some(raw) = self.get(l) {
                m.insert(l.name().into(), l.kind().to_wire(raw));
                m.insert(l.legacy_name().into(), json!(raw));
            }
        }
        m
    }

    /// The JSON Schema properties of the limits a request may send, keyed by name.
    pub fn schema_properties() -> serde_json::Map<String, Value> {
        Limit::ALL
            .iter()
            .map(|&l| (l.name().to_string(), l.kind().request_schema(l.doc())))
            .collect()
    }
}

impl LimitPolicy {
    /// One limit of a request as this policy bounds it, for a server's documents: the numeric
    /// form only (seconds, bytes, cores, counts), from the limit's minimum to the policy's
    /// maximum, described by `doc`. (Strings with units, "256M", are accepted too, and said so
    /// in the description; a schema stricter than the server is what validators need.)
    pub fn bounded_limit_schema(&self, l: Limit, doc: &str) -> Value {
        let k = l.kind();
        let integer = matches!(k, Kind::Bytes | Kind::Count);
        let unit = match k {
            Kind::Time => " Seconds (a string with a unit, \"500ms\", \"2m\", is accepted too).",
            Kind::Bytes => " Bytes (a string with a unit, \"256M\", is accepted too).",
            Kind::Cores => " CPU cores.",
            Kind::Count => "",
        };
        let minimum = Limits::MINIMUM.get(l).max(u64::from(k == Kind::Cores));
        json!({
            "description": format!("{doc}{unit}"),
            "type": [if integer { "integer" } else { "number" }, "null"],
            "minimum": k.to_wire(minimum),
            "maximum": k.to_wire(self.max.get(l)),
        })
    }

    /// The file-table bound (`pids × open_files` within `max_open_files_per_run`, see
    /// [`LimitPolicy::check_file_table`]) as JSON Schema can say it: an `anyOf` of tiers, one per
    /// power of two of `pids` up to its maximum, each allowing the `open_files` that fit beside
    /// it. A limit left out (or null) is the default, so a tier the default does not fit in
    /// requires the limit. Stricter than the check between two tiers, never looser.
    pub fn file_table_tiers(&self) -> Vec<Value> {
        let table = self.max_open_files_per_run;
        let (max_pids, min_pids) = (self.max.pids.0, Limits::MINIMUM.pids.0.max(1));
        let (default_pids, default_files) = (self.defaults.pids.0, self.defaults.open_files.0);
        let min_files = Limits::MINIMUM.open_files.0;
        let mut pids_steps: Vec<u64> = std::iter::successors(Some(min_pids), |p| p.checked_mul(2))
            .take_while(|p| *p < max_pids)
            .collect();
        pids_steps.push(max_pids);
        let mut tiers = Vec::new();
        for pids in pids_steps {
            let files = (table / pids).min(self.max.open_files.0);
            if files < min_files {
                break;
            }
            let bound = |max: u64, default: u64| {
                if default <= max {
                    json!({"maximum": max})
                } else {
                    json!({"type": "integer", "maximum": max})
                }
            };
            let mut required = Vec::new();
            if default_pids > pids {
                required.push("pids");
            }
            if default_files > files {
                required.push("open_files");
            }
            tiers.push(json!({
                "properties": {
                    "pids": bound(pids, default_pids),
                    "open_files": bound(files, default_files),
                },
                "required": required,
            }));
        }
        tiers
    }
}

/// The JSON Schema of a verdict's `limits` (and of `/v1/runtimes`' defaults and maxima): the
/// wire names, and the legacy names marked deprecated.
pub fn limits_output_schema() -> Value {
    let mut props = serde_json::Map::new();
    for &l in Limit::ALL {
        props.insert(l.name().into(), l.kind().output_schema(l.doc()));
    }
    for &l in Limit::ALL {
        if l.legacy_name() != l.name() {
            props.insert(
                l.legacy_name().into(),
                json!({
                    "type": "integer",
                    "minimum": 0,
                    "deprecated": true,
                    "description": format!("Deprecated: use `{}`. The same limit in its raw unit; removed in the next release.", l.name())
                }),
            );
        }
    }
    let required: Vec<&str> = Limit::ALL.iter().map(|l| l.name()).collect();
    json!({"type": "object", "properties": props, "required": required})
}

impl schemars::JsonSchema for Limits {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Limits".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::try_from(limits_output_schema()).unwrap_or_default()
    }
}

impl utoipa::PartialSchema for Limits {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::schema::openapi(limits_output_schema())
    }
}

impl utoipa::ToSchema for Limits {}

impl schemars::JsonSchema for LimitOverrides {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LimitOverrides".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::try_from(json!({
            "type": "object",
            "properties": LimitOverrides::schema_properties(),
            "additionalProperties": false
        }))
        .unwrap_or_default()
    }
}

/// A limit outside its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct LimitError {
    pub limit: Limit,
    /// Raw values, in the unit of the limit's kind.
    pub value: u64,
    pub minimum: u64,
    pub maximum: u64,
}

impl fmt::Display for LimitError {
    /// "memory is 1 TiB, above the maximum of 8 GiB".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.limit.kind();
        if self.value < self.minimum {
            write!(
                f,
                "{} is {}, below the minimum of {}",
                self.limit,
                k.describe(self.value),
                k.describe(self.minimum)
            )
        } else {
            write!(
                f,
                "{} is {}, above the maximum of {}",
                self.limit,
                k.describe(self.value),
                k.describe(self.maximum)
            )
        }
    }
}

/// `pids × open_files` beyond what one run may hold of the host's file table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "pids × open_files is {pids} × {open_files} = {} open files, more than the {max} one run may \
     hold (the host's file table is shared); ask for fewer processes or open files",
    .pids.saturating_mul(*.open_files)
)]
pub struct FileTableError {
    pub pids: u64,
    pub open_files: u64,
    pub max: u64,
}

/// The operator's limits: defaults and the most a request may ask for, and the caps on what a
/// request carries and gets back. (Part of the whole [`crate::Policy`]; the API still calls
/// it `Policy`.)
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(into = "PolicyWire")]
#[schemars(rename = "Policy")]
#[schema(as = Policy)]
pub struct LimitPolicy {
    pub defaults: Limits,
    pub max: Limits,
    /// Largest accepted program source.
    pub max_code_bytes: u64,
    /// Largest accepted stdin.
    pub max_stdin_bytes: u64,
    /// Input files: largest single file, and all of them together (also never more than the
    /// run's disk limit, where they are stored).
    pub max_input_file_bytes: u64,
    pub max_input_total_bytes: u64,
    pub max_input_files: u64,
    /// The most open files one run may hold at once, `pids × open_files` (every process may
    /// open `open_files`): the kernel's file table is shared by the whole host, and a run
    /// that fills it makes every other process fail with ENFILE. Derived from the host's
    /// `fs.file-max` so that all runs at once stay well within it.
    pub max_open_files_per_run: u64,
    /// Output files: up to which size (each, and all together) their content is included;
    /// beyond that only path, size, type and sha256 come back. How many are returned is the
    /// `output_files` limit.
    pub max_output_file_bytes: u64,
    pub max_output_total_bytes: u64,
}

/// The policy as `/v1/runtimes` writes it: its fields, and for one release the cap that the
/// `output_files` limit replaced.
#[derive(Serialize, schemars::JsonSchema)]
struct PolicyWire {
    defaults: Limits,
    max: Limits,
    max_code_bytes: u64,
    max_stdin_bytes: u64,
    max_input_file_bytes: u64,
    max_input_total_bytes: u64,
    max_input_files: u64,
    max_open_files_per_run: u64,
    max_output_file_bytes: u64,
    max_output_total_bytes: u64,
    /// Deprecated: `max.output_files`.
    #[schemars(extend("deprecated" = true))]
    max_output_files: u64,
}

impl From<LimitPolicy> for PolicyWire {
    fn from(p: LimitPolicy) -> Self {
        PolicyWire {
            max_output_files: p.max.output_files.0,
            defaults: p.defaults,
            max: p.max,
            max_code_bytes: p.max_code_bytes,
            max_stdin_bytes: p.max_stdin_bytes,
            max_input_file_bytes: p.max_input_file_bytes,
            max_input_total_bytes: p.max_input_total_bytes,
            max_input_files: p.max_input_files,
            max_open_files_per_run: p.max_open_files_per_run,
            max_output_file_bytes: p.max_output_file_bytes,
            max_output_total_bytes: p.max_output_total_bytes,
        }
    }
}

impl LimitPolicy {
    /// Share the memory runs may use (`usable_bytes`, see [`usable_memory`]) between `runs`
    /// at once: each run's maximum memory, and its maximum disk (its tmpfs pages are memory
    /// too), is at most its share and at most half, so that a run at both maxima fits in the
    /// memory ledger by itself; never below the defaults.
    pub fn share_memory(&mut self, usable_bytes: u64, runs: u64) {
        let share = (usable_bytes / runs.max(1)).min(usable_bytes / 2);
        self.max.memory = Bytes(self.max.memory.0.min(share.max(self.defaults.memory.0)));
        self.max.disk = Bytes(self.max.disk.0.min(share.max(self.defaults.disk.0)));
    }

    /// Maxima for this host: no more memory than it has, no more cores than it has, and
    /// generous but finite caps elsewhere.
    pub fn for_host(host_memory_bytes: u64, host_cpus: u64) -> LimitPolicy {
        LimitPolicy {
            defaults: Limits::DEFAULT,
            max: Limits {
                timeout: Millis::secs(3600),
                compile_timeout: Millis::secs(600),
                memory: Bytes(host_memory_bytes.max(Limits::DEFAULT.memory.0)),
                cpus: MilliCpus(host_cpus.max(1) * 1000),
                pids: Count(4096),
                disk: Bytes(16 << 30),
                output: Bytes(64 << 20),
                open_files: Count(65_536),
                // As many as before this was a limit: more is the operator's choice.
                output_files: Count(100),
                io_read: Bytes(4 << 30),
                io_write: Bytes(4 << 30),
            },
            max_code_bytes: 1 << 20,
            max_stdin_bytes: 16 << 20,
            max_input_file_bytes: 32 << 20,
            max_input_total_bytes: 64 << 20,
            max_input_files: 1000,
            // Until the host's file table is known (see `share_file_table`): the default
            // limits' product, 64 × 1024, is well within this.
            max_open_files_per_run: 1 << 20,
            max_output_file_bytes: 10 << 20,
            max_output_total_bytes: 32 << 20,
        }
    }

    /// Apply a request's overrides to the defaults and check every value against the minimum
    /// and the maximum. Nothing is clamped silently: out of range is an error naming the limit.
    pub fn resolve(&self, o: &LimitOverrides) -> Result<Limits, LimitError> {
        let l = o.apply_to(self.defaults);
        for &limit in Limit::ALL {
            let (value, minimum, maximum) = (
                l.get(limit),
                Limits::MINIMUM.get(limit),
                self.max.get(limit),
            );
            if value < minimum || value > maximum {
                return Err(LimitError {
                    limit,
                    value,
                    minimum,
                    maximum,
                });
            }
        }
        Ok(l)
    }
}

/// The caps a configuration may set (`[caps]`, `--cap NAME=VALUE`): sizes and counts of what a
/// request carries and gets back.
pub const CAP_NAMES: &[&str] = &[
    "code",
    "stdin",
    "input_file",
    "input_total",
    "input_files",
    "open_files_per_run",
    "output_files",
    "output_file",
    "output_total",
];

impl LimitPolicy {
    /// Set a cap from the text of a setting: a size (`1M`) or a count (`100`).
    pub fn set_cap(&mut self, name: &str, text: &str) -> Result<(), String> {
        let count = || {
            text.trim()
                .parse::<u64>()
                .map_err(|_| format!("cap {name}: '{text}' is not a count"))
        };
        let size = || parse_size(text).map_err(|e| format!("cap {name}: {e}"));
        match name {
            "code" => self.max_code_bytes = size()?,
            "stdin" => self.max_stdin_bytes = size()?,
            "input_file" => self.max_input_file_bytes = size()?,
            "input_total" => self.max_input_total_bytes = size()?,
            "input_files" => self.max_input_files = count()?,
            "open_files_per_run" => self.max_open_files_per_run = count()?,
            // Before `output_files` was a limit it was this cap: how many files every run
            // returned. It still means that: the default and the most a request may ask.
            "output_files" => {
                let n = Count(count()?);
                self.max.output_files = n;
                self.defaults.output_files = n;
            }
            "output_file" => self.max_output_file_bytes = size()?,
            "output_total" => self.max_output_total_bytes = size()?,
            other => {
                return Err(format!(
                    "unknown cap '{other}'; the caps are: {}",
                    CAP_NAMES.join(", ")
                ))
            }
        }
        Ok(())
    }

    /// Bound what `runs` runs at once may hold of a host file table of `file_max` entries to a
    /// quarter of it (the rest is the host's): each run gets its share, never less than the
    /// default limits need.
    pub fn share_file_table(&mut self, file_max: u64, runs: u64) {
        let share = file_max / 4 / runs.max(1);
        let floor = self.defaults.pids.0 * self.defaults.open_files.0;
        self.max_open_files_per_run = self.max_open_files_per_run.min(share.max(floor));
    }

    /// Keep `open_files` (maximum and default) within what the host can grant a process:
    /// its hard limit. Returns the maximum it had when it was above.
    pub fn clamp_open_files(&mut self, hard: u64) -> Option<u64> {
        let before = self.max.open_files.0;
        self.max.open_files.0 = before.min(hard);
        self.defaults.open_files.0 = self.defaults.open_files.0.min(self.max.open_files.0);
        (before > hard).then_some(before)
    }

    /// The file-table bound of a run with these limits: `pids × open_files` within
    /// `max_open_files_per_run`.
    pub fn check_file_table(&self, l: &Limits) -> Result<(), FileTableError> {
        let product = l.pids.0.saturating_mul(l.open_files.0);
        if product > self.max_open_files_per_run {
            return Err(FileTableError {
                pids: l.pids.0,
                open_files: l.open_files.0,
                max: self.max_open_files_per_run,
            });
        }
        Ok(())
    }

    /// How many output files a run returns unless it asks otherwise (the rest are counted in
    /// `files_omitted`).
    pub fn output_files_returned(&self) -> u64 {
        self.defaults.output_files.0
    }
}

/// Disk throughput defaults for the disk the host's files are on (read, write), in bytes per
/// second: a quarter for a disk that says it spins (many virtual disks say so too, so it is
/// still generous for a cold start of a runtime).
pub fn io_defaults(rotational: bool) -> (u64, u64) {
    if rotational {
        (64 << 20, 32 << 20)
    } else {
        (256 << 20, 128 << 20)
    }
}

/// What runs may use of a host's memory: all of it but a reserve for the host itself, an
/// eighth and at least 1 GiB (never more than half).
pub fn usable_memory(host_memory_bytes: u64) -> u64 {
    usable_memory_of(host_memory_bytes, false)
}

/// The least the server itself is given of a cgroup's limit: its own heap, the request
/// bodies in flight, the page cache of the runtimes it reads.
pub const SERVER_RESERVE_MIN: u64 = 128 << 20;

/// What runs may use of `bytes` of memory. On a bare host (`confined` false) the host keeps
/// an eighth and at least 1 GiB. In a cgroup (`confined`: a container, a pod, a unit with a
/// memory limit) only the server needs its share, since nothing else lives under that limit:
/// an eighth, at least [`SERVER_RESERVE_MIN`], at most 1 GiB. Never more than half either way.
pub fn usable_memory_of(bytes: u64, confined: bool) -> u64 {
    let reserve = if confined {
        (bytes / 8).clamp(SERVER_RESERVE_MIN, 1 << 30)
    } else {
        (bytes / 8).max(1 << 30)
    };
    bytes - reserve.min(bytes / 2)
}

/// The size of the host's file table from `fs.file-max` (normally /proc/sys/fs/file-max).
pub fn host_file_max(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Total memory of the host from a meminfo file (normally /proc/meminfo).
pub fn host_memory_bytes(meminfo: &std::path::Path) -> Option<u64> {
    runcell_jail::MemInfo::read(meminfo).ok()?.total_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> LimitPolicy {
        LimitPolicy::for_host(8 << 30, 2)
    }

    fn overrides(json: &str) -> Result<LimitOverrides, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn the_string_patterns_accept_what_the_parsers_read() {
        let props = LimitOverrides::schema_properties();
        let pattern = |limit: &str| {
            let p = props[limit]["oneOf"][1]["pattern"].as_str().unwrap();
            regex::Regex::new(p).unwrap()
        };
        let (duration, size) = (pattern("timeout"), pattern("memory"));
        for s in [
            "30", "2.5", ".5", "1.", "500ms", "2 m", " 10s ", "1h", "3min", "4sec", "", " ", ".",
            "1..2", "1e3", "-1", "5d", "ms", "1 2", "\u{1c}5s", "\t5s\r\n",
        ] {
            assert_eq!(
                duration.is_match(s),
                crate::units::parse_duration(s).is_ok(),
                "duration {s:?}"
            );
        }
        for s in [
            "65536", "256M", "1g", "1.5 GiB", "64kb", "10 bytes", "7B", "1 Byte", "2T", "", ".",
            "1e6", "-5", "5X", "M", "1 2", "3 mib", "4Ki",
        ] {
            assert_eq!(
                size.is_match(s),
                crate::units::parse_size(s).is_ok(),
                "size {s:?}"
            );
        }
    }

    #[test]
    fn the_file_table_tiers_accept_only_what_the_check_accepts() {
        let p = policy();
        let tiers = p.file_table_tiers();
        assert!(tiers.len() > 2, "{tiers:?}");
        // A tier's (pids, open_files): the bounds, a null for a default it allows.
        let fits = |pids: Option<u64>, files: Option<u64>| {
            tiers.iter().any(|t| {
                let ok = |name: &str, v: Option<u64>| {
                    let b = &t["properties"][name];
                    match v {
                        Some(v) => v <= b["maximum"].as_u64().unwrap(),
                        None => {
                            b.get("type").is_none()
                                && !t["required"].as_array().unwrap().iter().any(|r| r == name)
                        }
                    }
                };
                ok("pids", pids) && ok("open_files", files)
            })
        };
        let checked = |pids: Option<u64>, files: Option<u64>| {
            let mut l = p.defaults;
            if let Some(v) = pids {
                l.pids = Count(v);
            }
            if let Some(v) = files {
                l.open_files = Count(v);
            }
            p.check_file_table(&l).is_ok()
        };
        let mut agreed = 0;
        for pids in [
            None,
            Some(1),
            Some(2),
            Some(3),
            Some(64),
            Some(65),
            Some(1000),
            Some(p.max.pids.0),
        ] {
            for files in [
                None,
                Some(16),
                Some(64),
                Some(1024),
                Some(5000),
                Some(p.max.open_files.0),
            ] {
                if fits(pids, files) {
                    assert!(
                        checked(pids, files),
                        "the schema allows {pids:?} × {files:?}"
                    );
                }
                agreed += usize::from(fits(pids, files) == checked(pids, files));
            }
        }
        // Stricter between tiers only: most combinations agree.
        assert!(agreed > 40, "{agreed}");
        assert!(fits(None, None));
        let most = (Some(p.max.pids.0), Some(p.max.open_files.0));
        assert!(!checked(most.0, most.1) && !fits(most.0, most.1));
    }

    #[test]
    fn bounded_limit_schemas_follow_the_policy() {
        let props: serde_json::Map<String, Value> = Limit::ALL
            .iter()
            .map(|&l| {
                (
                    l.name().to_string(),
                    policy().bounded_limit_schema(l, l.doc()),
                )
            })
            .collect();
        for (name, schema) in &props {
            let (min, max) = (&schema["minimum"], &schema["maximum"]);
            assert!(min.as_f64().unwrap() >= 0.0, "{name}: {schema}");
            assert!(min.as_f64() <= max.as_f64(), "{name}: {schema}");
        }
        assert_eq!(props["memory"]["maximum"], json!(8u64 << 30));
        assert_eq!(props["cpus"]["maximum"].as_f64(), Some(2.0));
        assert_eq!(props["timeout"]["maximum"].as_f64(), Some(3600.0));
        assert_eq!(props["memory"]["type"], json!(["integer", "null"]));
        // A request at the bounds is accepted by the parser and the policy alike.
        let at_max = overrides(&format!(
            r#"{{"memory": {}, "cpus": {}}}"#,
            props["memory"]["maximum"], props["cpus"]["minimum"]
        ))
        .unwrap();
        assert!(policy().resolve(&at_max).is_ok());
    }

    #[test]
    fn the_table_names_match_the_deserializer() {
        let names: Vec<&str> = Limit::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(names, NAMES);
        for &l in Limit::ALL {
            assert_eq!(Limit::from_name(l.name()), Some(l));
            assert!(!l.doc().is_empty() && !l.doc().starts_with(' '));
        }
    }

    #[test]
    fn defaults_apply_when_nothing_is_asked() {
        assert_eq!(
            policy().resolve(&LimitOverrides::default()).unwrap(),
            Limits::DEFAULT
        );
    }

    #[test]
    fn overrides_within_range_are_taken() {
        let l = policy()
            .resolve(&overrides(r#"{"timeout": 5, "memory": "512M"}"#).unwrap())
            .unwrap();
        assert_eq!(l.timeout, Millis(5000));
        assert_eq!(l.memory, Bytes(512 << 20));
        assert_eq!(l.pids, Count(64));
    }

    #[test]
    fn wire_values_in_each_kind() {
        let o = overrides(
            r#"{"timeout": 2.5, "compile_timeout": "90s", "memory": 1048576, "disk": "1K",
                "cpus": 0.5, "pids": 8, "open_files": null}"#,
        )
        .unwrap();
        assert_eq!(o.timeout, Some(Millis(2500)));
        assert_eq!(o.compile_timeout, Some(Millis(90_000)));
        assert_eq!(o.memory, Some(Bytes(1 << 20)));
        assert_eq!(o.disk, Some(Bytes(1024)));
        assert_eq!(o.cpus, Some(MilliCpus(500)));
        assert_eq!(o.pids, Some(Count(8)));
        assert_eq!(o.open_files, None);
        for bad in [
            r#"{"timeout": -1}"#,
            r#"{"timeout": "soon"}"#,
            r#"{"timeout": [1]}"#,
            r#"{"memory": "12 parsecs"}"#,
            r#"{"memory": 1.5}"#,
            r#"{"memory": -5}"#,
            r#"{"cpus": 0}"#,
            r#"{"cpus": "2"}"#,
            r#"{"pids": -1}"#,
            r#"{"pids": "8"}"#,
            r#"{"timeout_ms": 5}"#,
            r#"{"timeout": 1, "timeout": 2}"#,
            r#"{"timeout": null, "timeout": 2}"#,
        ] {
            assert!(overrides(bad).is_err(), "{bad} must be refused");
        }
        let e = overrides(r#"{"memory": "12 parsecs"}"#).unwrap_err();
        assert!(e.starts_with("memory: "), "{e}");
        let e = overrides(r#"{"timeout": -1}"#).unwrap_err();
        assert!(e.starts_with("timeout must be a number of seconds"), "{e}");
    }

    #[test]
    fn limits_round_trip_and_keep_the_legacy_names() {
        let v = serde_json::to_value(Limits::DEFAULT).unwrap();
        assert_eq!(v["timeout"], json!(30));
        assert_eq!(v["timeout_ms"], json!(30_000));
        assert_eq!(v["memory"], json!(256 << 20));
        assert_eq!(v["memory_bytes"], json!(256 << 20));
        assert_eq!(v["cpus"], json!(1));
        assert_eq!(v["cpu_millis"], json!(1000));
        let back: Limits = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back, Limits::DEFAULT);
        // What a verdict reports can be sent back as a request.
        let mut wire = Limits::DEFAULT.to_wire();
        wire.insert("cpus".into(), json!(0.25));
        let o: LimitOverrides = serde_json::from_value(Value::Object(wire)).unwrap();
        assert_eq!(o.cpus, Some(MilliCpus(250)));
        assert_eq!(o.timeout, Some(Millis(30_000)));
    }

    #[test]
    fn text_values_from_flags_and_configuration() {
        let mut o = LimitOverrides::default();
        o.set_text(Limit::Timeout, "500ms").unwrap();
        o.set_text(Limit::Cpus, "0.5").unwrap();
        o.set_text(Limit::Pids, " 8 ").unwrap();
        o.set_text(Limit::Memory, "1G").unwrap();
        assert_eq!(o.timeout, Some(Millis(500)));
        assert_eq!(o.cpus, Some(MilliCpus(500)));
        assert_eq!(o.pids, Some(Count(8)));
        assert_eq!(o.memory, Some(Bytes(1 << 30)));
        assert!(o.set_text(Limit::Cpus, "0").is_err());
        assert!(o.set_text(Limit::Pids, "-1").is_err());
        assert!(o.set_text(Limit::Timeout, "soon").is_err());
    }

    #[test]
    fn out_of_range_names_the_limit_and_the_bound() {
        let e = policy()
            .resolve(&overrides(r#"{"memory": "64G"}"#).unwrap())
            .unwrap_err();
        assert_eq!(e.limit, Limit::Memory);
        assert_eq!((e.value, e.maximum), (64 << 30, 8 << 30));
        assert_eq!(
            e.to_string(),
            "memory is 64 GiB, above the maximum of 8 GiB"
        );
        let e = policy()
            .resolve(&overrides(r#"{"cpus": 8}"#).unwrap())
            .unwrap_err();
        assert!(e.to_string().contains("2 CPU"), "{e}");
        let e = policy()
            .resolve(&overrides(r#"{"timeout": 0}"#).unwrap())
            .unwrap_err();
        assert_eq!(e.limit, Limit::Timeout);
        assert!(e.to_string().contains("below the minimum"));
    }

    #[test]
    fn a_huge_number_of_cores_is_the_policys_call() {
        for cores in ["1e9", "1e300"] {
            let o = overrides(&format!(r#"{{"cpus": {cores}}}"#)).unwrap();
            let e = policy().resolve(&o).unwrap_err();
            assert_eq!(e.limit, Limit::Cpus, "{cores}");
            assert!(e.to_string().contains("above the maximum of 2 CPU"), "{e}");
        }
    }

    #[test]
    fn the_output_files_cap_still_sets_how_many_files_come_back() {
        let mut p = policy();
        p.set_cap("output_files", "500").unwrap();
        assert_eq!(p.output_files_returned(), 500);
        assert_eq!(p.max.output_files, Count(500));
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v["max_output_files"], 500,
            "the deprecated field, for one release"
        );
        assert_eq!(v["max"]["output_files"], 500);
    }

    #[test]
    fn runs_share_the_memory_and_the_host_keeps_a_reserve() {
        assert_eq!(usable_memory(24 << 30), 21 << 30);
        assert_eq!(usable_memory(4 << 30), 3 << 30);
        assert_eq!(usable_memory(1 << 30), 512 << 20);
        // In a 1 GiB container the server keeps 128 MiB, not half.
        assert_eq!(usable_memory_of(1 << 30, true), 896 << 20);
        assert_eq!(usable_memory_of(512 << 20, true), 384 << 20);
        assert_eq!(usable_memory_of(200 << 20, true), 100 << 20);
        assert_eq!(usable_memory_of(16 << 30, true), 15 << 30);
        assert_eq!(usable_memory_of(64 << 30, true), 63 << 30);
        assert_eq!(usable_memory_of(24 << 30, false), usable_memory(24 << 30));
        let mut p = LimitPolicy::for_host(21 << 30, 2);
        p.share_memory(21 << 30, 4);
        assert_eq!(p.max.memory, Bytes((21 << 30) / 4));
        assert_eq!(p.max.disk, Bytes((21 << 30) / 4));
        // One run at a time: memory and disk at their maxima still fit together.
        let mut one = LimitPolicy::for_host(896 << 20, 2);
        one.share_memory(896 << 20, 1);
        assert_eq!(one.max.memory.0 + one.max.disk.0, 896 << 20);
        // Never below the defaults.
        p.share_memory(1 << 30, 64);
        assert_eq!(p.max.memory, p.defaults.memory);
        assert!(p.resolve(&LimitOverrides::default()).is_ok());
    }

    #[test]
    fn the_file_table_is_shared_between_runs() {
        let mut p = policy();
        p.share_file_table(2_466_170, 2);
        assert_eq!(p.max_open_files_per_run, 2_466_170 / 8);
        assert!(p.check_file_table(&p.defaults).is_ok());
        let mut big = p.defaults;
        big.pids = Count(4096);
        big.open_files = Count(65_536);
        let e = p.check_file_table(&big).unwrap_err();
        assert!(e.to_string().contains("4096 × 65536 = 268435456"), "{e}");
        // A tiny table never refuses the defaults.
        let mut p = policy();
        p.share_file_table(1000, 64);
        assert_eq!(p.max_open_files_per_run, 64 * 1024);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("file-max"), "2466170\n").unwrap();
        assert_eq!(host_file_max(&dir.path().join("file-max")), Some(2_466_170));
    }

    #[test]
    fn schemas_cover_every_limit() {
        let props = LimitOverrides::schema_properties();
        assert_eq!(props.len(), Limit::ALL.len());
        let out = limits_output_schema();
        for &l in Limit::ALL {
            assert!(out["properties"][l.name()].is_object());
            assert!(out["properties"][l.legacy_name()].is_object());
        }
        assert!(!out.to_string().contains("uint64"));
    }

    #[test]
    fn meminfo_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("meminfo");
        std::fs::write(&p, "MemTotal:       24571604 kB\nMemFree: 1 kB\n").unwrap();
        assert_eq!(host_memory_bytes(&p), Some(24571604 * 1024));
        assert_eq!(host_memory_bytes(&dir.path().join("nope")), None);
    }

    #[test]
    fn open_files_are_clamped_to_the_hosts_hard_limit() {
        let mut p = LimitPolicy::for_host(8 << 30, 2);
        assert_eq!(p.clamp_open_files(20_000), Some(65_536));
        assert_eq!(p.max.open_files.0, 20_000);
        assert!(p.defaults.open_files.0 <= 20_000);
        assert_eq!(p.clamp_open_files(1 << 20), None);
        assert_eq!(p.max.open_files.0, 20_000);
        p.clamp_open_files(100);
        assert_eq!((p.max.open_files.0, p.defaults.open_files.0), (100, 100));
    }
}
