//! [`Limit`]: one "at most `max` units per `window`" rule, its slot precision, its accuracy
//! mode, its string form (`"120/min"`, `"240/h@1min"`) and its validation.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ConfigError;

/// The most slots one limit may use (one ring of `slots + 1` counters per key).
///
/// 3600 allows an hour at one-second precision; finer rings cost memory on every key.
///
/// ```
/// use std::time::Duration;
/// use slidegate::{ConfigError, Limit, MAX_SLOTS};
///
/// assert!(Limit::per_hour(10).precision(Duration::from_secs(1)).validate().is_ok()); // 3600 slots
/// let too_fine = Limit::per_hour(10).precision(Duration::from_millis(500));
/// assert!(matches!(too_fine.validate(), Err(ConfigError::TooManySlots { most: MAX_SLOTS, .. })));
/// ```
pub const MAX_SLOTS: u64 = 3600;

/// The largest `max` a limit may have: counts are kept in 32-bit fields.
///
/// ```
/// use slidegate::{ConfigError, Limit, MAX_UNITS};
///
/// assert!(Limit::per_second(MAX_UNITS).validate().is_ok());
/// assert!(matches!(Limit::per_second(MAX_UNITS + 1).validate(), Err(ConfigError::MaxTooLarge { .. })));
/// ```
pub const MAX_UNITS: u64 = u32::MAX as u64;

/// The longest window a limit may have: 100 years of 365 days.
///
/// The limiter's clock runs for 2⁶² ns (about 146 years) from its origin and then stands
/// still ([`ManualClock`](crate::ManualClock)); with windows at most this long, every time
/// the limiter computes (a slot's end, a retry time, an expiry) stays below 2⁶⁴ ns, so none
/// saturates into a wrong answer.
///
/// ```
/// use std::time::Duration;
/// use slidegate::{ConfigError, Limit, MAX_WINDOW};
///
/// assert_eq!(MAX_WINDOW, Duration::from_secs(100 * 365 * 86_400));
/// assert!(Limit::new(10, MAX_WINDOW).validate().is_ok());
/// let longer = Limit::new(10, MAX_WINDOW + Duration::from_secs(1));
/// assert!(matches!(longer.validate(), Err(ConfigError::WindowTooLong { .. })));
/// ```
pub const MAX_WINDOW: Duration = Duration::from_secs(100 * 365 * 86_400);

/// How the oldest, partly elapsed slot of a window is counted.
///
/// ```
/// use slidegate::{Accuracy, Limit};
///
/// assert_eq!(Limit::per_minute(60).accuracy(), Accuracy::Interpolated); // the default
/// assert_eq!(Limit::per_minute(60).strict().accuracy(), Accuracy::Strict);
/// assert_eq!("60/min strict".parse::<Limit>()?.accuracy(), Accuracy::Strict);
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Accuracy {
    /// The oldest slot counts in proportion to the part of it still inside the window (the
    /// two-bucket estimate generalised to N slots). Smooth, but it assumes the old slot's
    /// traffic was spread evenly, so an exact interval of one window can hold more than `max`.
    Interpolated,
    /// The oldest slot counts whole until it has left the window entirely: no interval of
    /// length `window` ever holds more than `max` admitted units. The price is that a unit
    /// can be held back for up to one slot longer than the window.
    Strict,
}

/// A rate limit: at most `max` units in any `window`, counted in slots of `precision`.
///
/// Build one with [`Limit::new`], [`Limit::per_second`], [`Limit::per_minute`],
/// [`Limit::per_hour`], or parse it from a string:
///
/// ```
/// use std::time::Duration;
/// use slidegate::Limit;
///
/// let a: Limit = "120/min".parse()?;
/// assert_eq!(a, Limit::per_minute(120));
///
/// let b: Limit = "240/h@1min".parse()?;
/// assert_eq!(b, Limit::new(240, Duration::from_secs(3600)).precision(Duration::from_secs(60)));
///
/// let c: Limit = "60/min strict".parse()?;
/// assert_eq!(c, Limit::per_minute(60).strict());
/// assert_eq!(c.to_string(), "60/min strict");
/// # Ok::<(), slidegate::ConfigError>(())
/// ```
///
/// The string form is `MAX/[N]UNIT[@[N]UNIT][ strict]`, with units `ms`, `s`, `min`
/// (also `m`), `h` and `d` (and their long spellings `sec`, `second(s)`, `minute(s)`,
/// `hour(s)`, `day(s)`). The part after `@` is the precision.
///
/// **Default precision.** A window of up to a minute that is a whole number of seconds is
/// counted in 1-second slots; a longer window in 60 slots. When that would not divide the
/// window into whole milliseconds, the default is the largest number of slots below it that
/// does (at worst one slot). The default therefore always divides the window.
///
/// **In configuration files** (feature `serde`), a `Limit` is the string its `Display`
/// writes and `FromStr` reads, so `"120/min"`, `"240/h@1min"` and `"60/min strict"` load
/// from TOML, YAML or JSON as they are written everywhere else; a bad string is an error
/// that says what is wrong.
///
/// ```
/// # #[cfg(feature = "serde")] {
/// use slidegate::Limit;
/// let limits: Vec<Limit> = serde_json::from_str(r#"["10/s", "120/min", "240/h@1min strict"]"#).unwrap();
/// assert_eq!(limits[1], Limit::per_minute(120));
/// assert_eq!(serde_json::to_string(&limits[0]).unwrap(), r#""10/s""#);
/// assert!(serde_json::from_str::<Limit>(r#""10 per s""#).unwrap_err().to_string().contains("10 per s"));
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limit {
    max: u64,
    window: Duration,
    precision: Duration,
    accuracy: Accuracy,
    /// GCRA only: the bucket's size in units, when not `max`.
    burst: Option<u64>,
}

impl Limit {
    /// At most `max` units per `window`, with the default precision and interpolated
    /// accuracy. Nothing is checked here: [`Limit::validate`] and the limiter's builder
    /// report a bad value as a [`ConfigError`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::Limit;
    ///
    /// let l = Limit::new(500, Duration::from_secs(15 * 60));
    /// assert_eq!(l.get_precision(), Duration::from_secs(15));
    /// ```
    pub fn new(max: u64, window: Duration) -> Limit {
        Limit {
            max,
            window,
            precision: default_precision(window),
            accuracy: Accuracy::Interpolated,
            burst: None,
        }
    }

    /// At most `max` units per second (one 1-second slot).
    ///
    /// ```
    /// assert_eq!(slidegate::Limit::per_second(10).max(), 10);
    /// ```
    pub fn per_second(max: u64) -> Limit {
        Limit::new(max, Duration::from_secs(1))
    }

    /// At most `max` units per minute (sixty 1-second slots).
    ///
    /// ```
    /// assert_eq!(slidegate::Limit::per_minute(120).slots(), 60);
    /// ```
    pub fn per_minute(max: u64) -> Limit {
        Limit::new(max, Duration::from_secs(60))
    }

    /// At most `max` units per hour (sixty 1-minute slots).
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(slidegate::Limit::per_hour(240).get_precision(), Duration::from_secs(60));
    /// ```
    pub fn per_hour(max: u64) -> Limit {
        Limit::new(max, Duration::from_secs(3600))
    }

    /// The same limit counted in slots of `precision` (it must divide the window).
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::Limit;
    ///
    /// let l = Limit::per_minute(60).precision(Duration::from_secs(60));
    /// assert_eq!(l.slots(), 1); // the classic two-bucket estimate
    /// ```
    #[must_use]
    pub fn precision(mut self, precision: Duration) -> Limit {
        self.precision = precision;
        self
    }

    /// The same limit with [`Accuracy::Strict`]: the oldest slot counts whole, so no
    /// interval of length `window` ever holds more than `max` admitted units.
    ///
    /// ```
    /// use slidegate::{Accuracy, Limit};
    /// assert_eq!(Limit::per_minute(60).strict().accuracy(), Accuracy::Strict);
    /// ```
    #[must_use]
    pub fn strict(mut self) -> Limit {
        self.accuracy = Accuracy::Strict;
        self
    }

    /// Under [`Algorithm::Gcra`](crate::Algorithm::Gcra), a bucket of `units` instead of
    /// `max` (governor's `Quota::allow_burst`): up to `units` at once from a full bucket,
    /// refilled at the limit's rate, `max` per window. A key idle long enough can take
    /// `units` in one burst, so a window can see more than `max` when `units` is larger:
    /// that is what a burst allowance means. String form: `"10/s burst 50"`. Other
    /// algorithms have no bucket: the builder refuses a burst under them
    /// ([`ConfigError::BurstNeedsGcra`]).
    ///
    /// ```
    /// use slidegate::{Algorithm, Limit, Limiter};
    /// let limit = Limit::per_second(10).burst(50);
    /// assert_eq!(limit, "10/s burst 50".parse()?);
    /// let limiter = Limiter::<u64>::builder().algorithm(Algorithm::Gcra).limit(limit).build()?;
    /// assert_eq!(limiter.check_n(&1, 50).remaining(), 0); // a full bucket of 50
    /// # Ok::<(), slidegate::ConfigError>(())
    /// ```
    #[must_use]
    pub fn burst(mut self, units: u64) -> Limit {
        self.burst = Some(units);
        self
    }

    /// The bucket's size under GCRA when set with [`burst`](Self::burst).
    ///
    /// ```
    /// assert_eq!(slidegate::Limit::per_second(10).burst(50).get_burst(), Some(50));
    /// assert_eq!(slidegate::Limit::per_second(10).get_burst(), None);
    /// ```
    pub fn get_burst(&self) -> Option<u64> {
        self.burst
    }

    /// The most units admitted per window.
    ///
    /// ```
    /// assert_eq!(slidegate::Limit::per_second(7).max(), 7);
    /// ```
    pub fn max(&self) -> u64 {
        self.max
    }

    /// The window length.
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(slidegate::Limit::per_minute(1).window(), Duration::from_secs(60));
    /// ```
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The slot length: counts are kept per slot, and the window moves a slot at a time
    /// (strict) or continuously by interpolation (interpolated).
    ///
    /// ```
    /// use std::time::Duration;
    /// assert_eq!(slidegate::Limit::per_minute(1).get_precision(), Duration::from_secs(1));
    /// ```
    pub fn get_precision(&self) -> Duration {
        self.precision
    }

    /// How the oldest slot is counted.
    ///
    /// ```
    /// use slidegate::{Accuracy, Limit};
    /// assert_eq!(Limit::per_second(1).accuracy(), Accuracy::Interpolated);
    /// ```
    pub fn accuracy(&self) -> Accuracy {
        self.accuracy
    }

    /// Slots per window (`window / precision`), or 0 when the precision is zero.
    ///
    /// ```
    /// assert_eq!(slidegate::Limit::per_second(1).slots(), 1);
    /// ```
    pub fn slots(&self) -> u64 {
        match self.window.as_nanos().checked_div(self.precision.as_nanos()) {
            Some(slots) => u64::try_from(slots).unwrap_or(u64::MAX),
            None => 0,
        }
    }

    /// Checks this limit on its own (the builder also checks the limits against each other).
    ///
    /// ```
    /// use std::time::Duration;
    /// use slidegate::{ConfigError, Limit};
    ///
    /// assert!(Limit::per_second(10).validate().is_ok());
    /// let bad = Limit::per_minute(10).precision(Duration::from_secs(7));
    /// assert!(matches!(bad.validate(), Err(ConfigError::PrecisionDoesNotDivideWindow { .. })));
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        let limit = *self;
        if self.max == 0 {
            return Err(ConfigError::ZeroMax { limit });
        }
        if self.max > MAX_UNITS {
            return Err(ConfigError::MaxTooLarge { limit, most: MAX_UNITS });
        }
        if self.window.is_zero() {
            return Err(ConfigError::ZeroWindow { limit });
        }
        if self.window > MAX_WINDOW {
            return Err(ConfigError::WindowTooLong { limit, most: MAX_WINDOW });
        }
        if self.precision.is_zero() {
            return Err(ConfigError::ZeroPrecision { limit });
        }
        if !whole_millis(self.window) || !whole_millis(self.precision) {
            return Err(ConfigError::NotWholeMilliseconds { limit });
        }
        if self.precision > self.window {
            return Err(ConfigError::PrecisionLongerThanWindow { limit });
        }
        if self.window.as_nanos().checked_rem(self.precision.as_nanos()) != Some(0) {
            return Err(ConfigError::PrecisionDoesNotDivideWindow { limit });
        }
        if self.slots() > MAX_SLOTS {
            return Err(ConfigError::TooManySlots { limit, slots: self.slots(), most: MAX_SLOTS });
        }
        match self.burst {
            Some(0) => Err(ConfigError::ZeroBurst { limit }),
            Some(units) if units > MAX_UNITS => Err(ConfigError::BurstTooLarge { limit, most: MAX_UNITS }),
            _ => Ok(()),
        }
    }
}

fn whole_millis(d: Duration) -> bool {
    d.subsec_nanos() % 1_000_000 == 0
}

/// See the type-level docs of [`Limit`]: 1 s slots up to a minute, 60 slots above, and the
/// largest slot count below that which divides the window into whole milliseconds.
fn default_precision(window: Duration) -> Duration {
    let ms = window.as_millis();
    if ms == 0 || !whole_millis(window) {
        return window;
    }
    let target = if ms <= 60_000 { (ms / 1000).max(1) } else { 60 };
    let slots = (1..=target).rev().find(|&n| ms.checked_rem(n) == Some(0)).unwrap_or(1);
    Duration::from_millis(u64::try_from(ms.checked_div(slots).unwrap_or(ms)).unwrap_or(u64::MAX))
}

impl fmt::Display for Limit {
    /// The canonical string form, which parses back to an equal `Limit`. The precision is
    /// written only when it differs from the default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/", self.max)?;
        write_span(f, self.window)?;
        if self.precision != default_precision(self.window) {
            f.write_str("@")?;
            write_span(f, self.precision)?;
        }
        if let Some(units) = self.burst {
            write!(f, " burst {units}")?;
        }
        if self.accuracy == Accuracy::Strict {
            f.write_str(" strict")?;
        }
        Ok(())
    }
}

fn write_span(f: &mut fmt::Formatter<'_>, d: Duration) -> fmt::Result {
    const UNITS: [(u128, &str); 5] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "min"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
    ];
    let ns = d.as_nanos();
    #[allow(clippy::arithmetic_side_effects, reason = "dividing by the non-zero constants above")]
    for (unit, name) in UNITS {
        if ns != 0 && ns % unit == 0 {
            let n = ns / unit;
            return if n == 1 { f.write_str(name) } else { write!(f, "{n}{name}") };
        }
    }
    write!(f, "{ns}ns")
}

impl FromStr for Limit {
    type Err = ConfigError;

    /// Parses `MAX/[N]UNIT[@[N]UNIT][ burst N][ strict]` and validates the result.
    ///
    /// ```
    /// use slidegate::{ConfigError, Limit};
    /// assert!("10/s".parse::<Limit>().is_ok());
    /// assert!(matches!("ten/s".parse::<Limit>(), Err(ConfigError::Parse { .. })));
    /// assert!(matches!("0/s".parse::<Limit>(), Err(ConfigError::ZeroMax { .. })));
    /// ```
    fn from_str(input: &str) -> Result<Limit, ConfigError> {
        let fail = |reason: &'static str| ConfigError::Parse { input: input.to_owned(), reason };
        let text = input.trim();
        let (text, strict) = match text.strip_suffix("strict") {
            Some(rest) if rest.ends_with(char::is_whitespace) => (rest.trim_end(), true),
            Some(_) => return Err(fail("write ' strict' after the limit, separated by a space")),
            None => (text, false),
        };
        let (text, burst) = match text.rsplit_once(char::is_whitespace) {
            Some((head, units)) if head.trim_end().ends_with("burst") => {
                let head = head.trim_end().strip_suffix("burst").unwrap_or(head).trim_end();
                let units: u64 = units.parse().map_err(|_| {
                    fail("a burst is a whole number of units, e.g. the 50 in \"10/s burst 50\"")
                })?;
                (head, Some(units))
            }
            _ => (text, None),
        };
        let (max, rest) =
            text.split_once('/').ok_or_else(|| fail("expected MAX/WINDOW, e.g. \"120/min\""))?;
        let max: u64 = max
            .trim()
            .parse()
            .map_err(|_| fail("MAX must be a whole number of units, e.g. the 120 in \"120/min\""))?;
        let (window, precision) = match rest.split_once('@') {
            Some((w, p)) => (w, Some(p)),
            None => (rest, None),
        };
        let window = parse_span(window).map_err(fail)?;
        let mut limit = Limit::new(max, window);
        if let Some(p) = precision {
            limit = limit.precision(parse_span(p).map_err(fail)?);
        }
        if strict {
            limit = limit.strict();
        }
        if let Some(units) = burst {
            limit = limit.burst(units);
        }
        limit.validate()?;
        Ok(limit)
    }
}

/// `[N]UNIT`, e.g. `s`, `15min`, `250ms`.
fn parse_span(text: &str) -> Result<Duration, &'static str> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    // `split` is a char boundary (a non-digit's start) or the end.
    let (count, unit) = text.split_at_checked(split).unwrap_or((text, ""));
    let count: u64 = if count.is_empty() {
        1
    } else {
        count.parse().map_err(|_| "the count before a time unit is too large")?
    };
    let unit_ms: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" | "millis" | "millisecond" | "milliseconds" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "m" | "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        "" => return Err("a time unit is missing: use ms, s, min, h or d"),
        _ => return Err("unknown time unit: use ms, s, min, h or d"),
    };
    let ms = count.checked_mul(unit_ms).ok_or("the time span is too long")?;
    Ok(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_precision_divides_every_window() {
        for ms in [1u64, 7, 100, 999, 1000, 1500, 10_000, 59_999, 60_000, 61_000, 90_000, 3_600_000] {
            let l = Limit::new(1, Duration::from_millis(ms));
            assert!(l.validate().is_ok(), "{ms} ms: {:?}", l.validate());
        }
        assert_eq!(Limit::new(1, Duration::from_millis(1500)).slots(), 1);
        assert_eq!(Limit::new(1, Duration::from_secs(90)).slots(), 60);
        assert_eq!(Limit::new(1, Duration::from_secs(15 * 60)).get_precision(), Duration::from_secs(15));
    }

    #[test]
    fn parses_the_documented_forms() {
        let cases = [
            ("10/s", Limit::per_second(10)),
            ("120/min", Limit::per_minute(120)),
            ("240/h", Limit::per_hour(240)),
            ("500/15min", Limit::new(500, Duration::from_secs(900))),
            ("240/h@1min", Limit::per_hour(240).precision(Duration::from_secs(60))),
            (
                " 5 / 10 s @ 5s strict ",
                Limit::new(5, Duration::from_secs(10)).precision(Duration::from_secs(5)).strict(),
            ),
            ("3/250ms", Limit::new(3, Duration::from_millis(250))),
            ("1/d", Limit::new(1, Duration::from_secs(86_400))),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Limit>(), Ok(want), "{text}");
        }
    }

    #[test]
    fn display_round_trips() {
        for text in
            ["10/s", "120/min", "240/h", "500/15min", "240/h@10min", "60/min strict", "3/250ms", "2/90s@45s"]
        {
            let l: Limit = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(l.to_string().parse::<Limit>(), Ok(l), "{text} -> {l}");
        }
        assert_eq!(Limit::per_hour(240).precision(Duration::from_secs(60)).to_string(), "240/h");
        assert_eq!(Limit::per_hour(240).precision(Duration::from_secs(600)).to_string(), "240/h@10min");
    }

    #[test]
    fn rejects_bad_strings_with_a_reason() {
        for text in [
            "",
            "10",
            "10/",
            "/s",
            "x/s",
            "10/parsec",
            "10/s@",
            "10/sstrict",
            "99999999999999999999/s",
            "10/99999999999999999999d",
        ] {
            match text.parse::<Limit>() {
                Err(e) => assert!(!e.to_string().is_empty()),
                Ok(l) => panic!("{text:?} parsed as {l:?}"),
            }
        }
        assert!(matches!("0/s".parse::<Limit>(), Err(ConfigError::ZeroMax { .. })));
        assert!(matches!("1/0s".parse::<Limit>(), Err(ConfigError::ZeroWindow { .. })));
        assert!(matches!("1/min@7s".parse::<Limit>(), Err(ConfigError::PrecisionDoesNotDivideWindow { .. })));
        assert!(matches!("1/s@1min".parse::<Limit>(), Err(ConfigError::PrecisionLongerThanWindow { .. })));
        assert!(matches!("1/d@1s".parse::<Limit>(), Err(ConfigError::TooManySlots { .. })));
        assert!(matches!("4294967296/s".parse::<Limit>(), Err(ConfigError::MaxTooLarge { .. })));
    }
}

// `Limit` in configuration files (feature `serde`): see the type's docs.
#[cfg(feature = "serde")]
mod serde_impls {
    use super::Limit;

    impl serde::Serialize for Limit {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(self)
        }
    }

    impl<'de> serde::Deserialize<'de> for Limit {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Limit, D::Error> {
            let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
            text.parse().map_err(serde::de::Error::custom)
        }
    }
}
