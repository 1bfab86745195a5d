//! Random cron expressions with what they mean: each field's text and, computed here without the
//! crate, the set of values it matches plus the Quartz day tokens it holds (whose days the
//! reference in `model` works out per date). Also the macros, with their fields spelled out.

use proptest::prelude::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Second,
    Minute,
    Hour,
    Dom,
    Month,
    Dow,
}

impl Kind {
    fn bounds(self) -> (u32, u32) {
        match self {
            Kind::Second | Kind::Minute => (0, 59),
            Kind::Hour => (0, 23),
            Kind::Dom => (1, 31),
            Kind::Month => (1, 12),
            Kind::Dow => (0, 7),
        }
    }
    fn step_end(self) -> u32 {
        if self == Kind::Dow {
            6
        } else {
            self.bounds().1
        }
    }
}

/// A Quartz day token, as the reference understands it (see `model` for the definitions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DayRule {
    /// `L-n` (`L` when n = 0).
    Last(u32),
    /// `L-nW` (`LW` when n = 0).
    LastNearest(u32),
    /// `nW`.
    Nearest(u32),
    /// `wL`, w in 0..=6.
    LastOf(u32),
    /// `w#k`, w in 0..=6.
    Nth(u32, u32),
}

/// One generated field: its text, the set of values it must match, and its day tokens.
#[derive(Debug, Clone)]
pub struct GenField {
    pub text: String,
    pub set: u64,
    pub rules: Vec<DayRule>,
    pub star: bool,
    pub single: bool,
}

impl GenField {
    /// A field given by its meaning (for the macros' expansions).
    fn fixed(text: &str, set: u64, star: bool, single: bool) -> GenField {
        GenField {
            text: text.into(),
            set,
            rules: Vec::new(),
            star,
            single,
        }
    }
}

const MONTHS: [&str; 12] = [
    "jan", "FEB", "Mar", "APR", "may", "JUN", "jul", "AUG", "Sep", "OCT", "nov", "DEC",
];
const DAYS: [&str; 7] = ["SUN", "mon", "Tue", "WED", "thu", "FRI", "sat"];

/// Renders a value, as a name when `named` and the field has names. `end` marks a range end,
/// where Sunday must be written `SUN` only for 7 (SUN as a range end means 7).
fn render(kind: Kind, v: u32, named: bool, end: bool) -> String {
    match kind {
        Kind::Month if named => MONTHS[v as usize - 1].to_string(),
        Kind::Dow if named && (1..=6).contains(&v) => DAYS[v as usize].to_string(),
        Kind::Dow if named && v == 7 && end => "SUN".into(),
        Kind::Dow if named && v == 0 && !end => "sun".into(),
        _ => v.to_string(),
    }
}

pub fn bits(lo: u32, hi: u32, step: u32) -> u64 {
    (lo..=hi).step_by(step as usize).fold(0, |b, v| b | 1 << v)
}

fn fold7(kind: Kind, set: u64) -> u64 {
    if kind == Kind::Dow && set & (1 << 7) != 0 {
        (set & !(1 << 7)) | 1
    } else {
        set
    }
}

/// A value, biased towards the small hours where DST transitions happen.
fn value(kind: Kind) -> BoxedStrategy<u32> {
    let (lo, hi) = kind.bounds();
    if kind == Kind::Hour {
        prop_oneof![0u32..=4, lo..=hi].boxed()
    } else {
        (lo..=hi).boxed()
    }
}

/// One plain list item: value, range, or one of the three step forms.
fn item(kind: Kind) -> BoxedStrategy<(String, u64)> {
    let (lo, hi) = kind.bounds();
    let span = hi - lo + 1;
    prop_oneof![
        (value(kind), any::<bool>())
            .prop_map(move |(v, n)| (render(kind, v, n, false), bits(v, v, 1))),
        (value(kind), value(kind), any::<bool>()).prop_map(move |(a, b, n)| {
            let (a, b) = (a.min(b), a.max(b));
            (
                format!("{}-{}", render(kind, a, n, false), render(kind, b, n, true)),
                bits(a, b, 1),
            )
        }),
        (1..=span).prop_map(move |s| (format!("*/{s}"), bits(lo, kind.step_end(), s))),
        (value(kind), 1..=span)
            .prop_map(move |(a, s)| { (format!("{a}/{s}"), bits(a, kind.step_end().max(a), s)) }),
        (value(kind), value(kind), 1..=span).prop_map(move |(a, b, s)| {
            let (a, b) = (a.min(b), a.max(b));
            (format!("{a}-{b}/{s}"), bits(a, b, s))
        }),
    ]
    .boxed()
}

/// `text` in upper or lower case: the tokens' letters are case-insensitive.
fn cased(text: String, lower: bool) -> String {
    if lower {
        text.to_lowercase()
    } else {
        text
    }
}

/// A day-of-month token with its meaning. Offsets and days are drawn over their whole ranges,
/// so tokens that select nothing in some months (`L-30`, `31W`) come up too, but offsets are
/// mostly small: the EU clock changes are on the last Sunday, `L` to `L-6`.
fn dom_token() -> BoxedStrategy<(String, DayRule)> {
    let offset = || prop_oneof![2 => 0u32..=6, 1 => 0u32..=30];
    prop_oneof![
        (offset(), any::<bool>(), any::<bool>()).prop_map(|(n, bare, lower)| {
            let text = if n == 0 && bare {
                "L".into()
            } else {
                format!("L-{n}")
            };
            (cased(text, lower), DayRule::Last(n))
        }),
        (offset(), any::<bool>(), any::<bool>()).prop_map(|(n, bare, lower)| {
            let text = if n == 0 && bare {
                "LW".into()
            } else {
                format!("L-{n}W")
            };
            (cased(text, lower), DayRule::LastNearest(n))
        }),
        (1u32..=31, any::<bool>())
            .prop_map(|(d, lower)| (cased(format!("{d}W"), lower), DayRule::Nearest(d))),
    ]
    .boxed()
}

/// A day-of-week token with its meaning; the weekday is a number 0–7 or a name, often Sunday
/// (the day most clocks change) or Friday (Israel's spring change), and `#k` often 1 or 2
/// (the first and second Sundays of the US and Lord Howe changes).
fn dow_token() -> BoxedStrategy<(String, DayRule)> {
    let day = prop_oneof![2 => prop::sample::select(&[0u32, 7, 5][..]), 3 => 0u32..=7];
    let weekday = (day, any::<bool>()).prop_map(|(w, named)| {
        let text = if named {
            DAYS[w as usize % 7].to_string()
        } else {
            w.to_string()
        };
        (text, w % 7)
    });
    prop_oneof![
        (weekday.clone(), any::<bool>()).prop_map(|((text, w), lower)| {
            (cased(format!("{text}L"), lower), DayRule::LastOf(w))
        }),
        (weekday, prop_oneof![1u32..=2, 1u32..=5])
            .prop_map(|((text, w), k)| (format!("{text}#{k}"), DayRule::Nth(w, k))),
    ]
    .boxed()
}

/// A list item of any kind: plain (its value set) or a day token (its rule).
type Item = (String, u64, Option<DayRule>);

fn any_item(kind: Kind) -> BoxedStrategy<Item> {
    let plain = item(kind).prop_map(|(text, set)| (text, set, None));
    let token = match kind {
        Kind::Dom => dom_token(),
        Kind::Dow => dow_token(),
        _ => return plain.boxed(),
    };
    prop_oneof![2 => plain, 3 => token.prop_map(|(text, rule)| (text, 0, Some(rule)))].boxed()
}

fn list_field(kind: Kind) -> impl Strategy<Value = GenField> {
    prop::collection::vec(any_item(kind), 1..=3).prop_map(move |items| {
        let single =
            items.len() == 1 && items[0].2.is_none() && !items[0].0.contains(['-', '/', '*']);
        let text = items
            .iter()
            .map(|(t, _, _)| t.as_str())
            .collect::<Vec<_>>()
            .join(",");
        GenField {
            star: text.starts_with('*'),
            set: fold7(kind, items.iter().fold(0, |b, (_, s, _)| b | s)),
            rules: items.iter().filter_map(|(_, _, r)| *r).collect(),
            text,
            single,
        }
    })
}

/// A whole field; `star_weight` biases towards `*` for fields that would otherwise rarely
/// match inside the test window (days, months).
pub fn field(kind: Kind, star_weight: u32) -> BoxedStrategy<GenField> {
    let (lo, hi) = kind.bounds();
    let full = fold7(kind, bits(lo, hi, 1));
    let day_field = matches!(kind, Kind::Dom | Kind::Dow);
    let star = prop_oneof![Just("*"), Just(if day_field { "?" } else { "*" })]
        .prop_map(move |t| GenField::fixed(t, full, true, false));
    if kind == Kind::Hour {
        // The DST rules hinge on a single-value hour; make it common, and near the transitions.
        let single = (0u32..=3).prop_map(|v| GenField::fixed(&v.to_string(), 1 << v, false, true));
        return prop_oneof![star_weight => star, 10 => list_field(kind), 8 => single].boxed();
    }
    prop_oneof![star_weight => star, 10 => list_field(kind)].boxed()
}

#[derive(Debug, Clone)]
pub struct GenCron {
    pub seconds: GenField,
    pub with_seconds: bool,
    pub minute: GenField,
    pub hour: GenField,
    pub dom: GenField,
    pub month: GenField,
    pub dow: GenField,
    /// Written as this macro instead of its fields.
    pub macro_name: Option<String>,
}

impl GenCron {
    pub fn text(&self) -> String {
        if let Some(name) = &self.macro_name {
            return name.clone();
        }
        let five = [&self.minute, &self.hour, &self.dom, &self.month, &self.dow]
            .map(|f| f.text.as_str())
            .join(" ");
        if self.with_seconds {
            format!("{} {five}", self.seconds.text)
        } else {
            five
        }
    }

    pub fn seconds_set(&self) -> u64 {
        if self.with_seconds {
            self.seconds.set
        } else {
            1
        }
    }
}

/// The macros, with the fields of their standard meanings spelled out.
fn gen_macro() -> impl Strategy<Value = GenCron> {
    const NAMES: [&str; 7] = [
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
    ];
    (prop::sample::select(&NAMES[..]), any::<bool>()).prop_map(|(name, upper)| {
        let star = |kind: Kind| {
            let (lo, hi) = kind.bounds();
            GenField::fixed("*", fold7(kind, bits(lo, hi, 1)), true, false)
        };
        let one = |v: u32| GenField::fixed(&v.to_string(), 1 << v, false, true);
        let (hour, dom, month, dow) = match name {
            "@yearly" | "@annually" => (one(0), one(1), one(1), star(Kind::Dow)),
            "@monthly" => (one(0), one(1), star(Kind::Month), star(Kind::Dow)),
            "@weekly" => (one(0), star(Kind::Dom), star(Kind::Month), one(0)),
            "@daily" | "@midnight" => (one(0), star(Kind::Dom), star(Kind::Month), star(Kind::Dow)),
            _ => (
                star(Kind::Hour),
                star(Kind::Dom),
                star(Kind::Month),
                star(Kind::Dow),
            ),
        };
        GenCron {
            seconds: one(0),
            with_seconds: false,
            minute: one(0),
            hour,
            dom,
            month,
            dow,
            macro_name: Some(if upper {
                name.to_uppercase()
            } else {
                name.to_string()
            }),
        }
    })
}

/// Any expression: fields (day tokens included) or, now and then, a macro.
pub fn gen_cron() -> impl Strategy<Value = GenCron> {
    let fields = (
        field(Kind::Second, 3),
        any::<bool>(),
        field(Kind::Minute, 2),
        field(Kind::Hour, 4),
        field(Kind::Dom, 30),
        field(Kind::Month, 30),
        field(Kind::Dow, 20),
    )
        .prop_map(
            |(seconds, with_seconds, minute, hour, dom, month, dow)| GenCron {
                seconds,
                with_seconds,
                minute,
                hour,
                dom,
                month,
                dow,
                macro_name: None,
            },
        );
    prop_oneof![12 => fields, 1 => gen_macro()]
}

/// Expressions for searches over years: few fires a day (1–2 minutes, 1–2 hours), day fields
/// that usually hold tokens, and months mostly `*` so that tokens meet every month shape.
pub fn gen_day_cron() -> impl Strategy<Value = GenCron> {
    let few = |kind: Kind| {
        prop::collection::btree_set(value(kind), 1..=2).prop_map(|vs| GenField {
            text: vs.iter().map(u32::to_string).collect::<Vec<_>>().join(","),
            set: vs.iter().fold(0, |b, v| b | 1 << v),
            rules: Vec::new(),
            star: false,
            single: vs.len() == 1,
        })
    };
    (
        few(Kind::Minute),
        few(Kind::Hour),
        field(Kind::Dom, 3),
        field(Kind::Month, 12),
        field(Kind::Dow, 3),
    )
        .prop_map(|(minute, hour, dom, month, dow)| GenCron {
            seconds: GenField::fixed("0", 1, false, true),
            with_seconds: false,
            minute,
            hour,
            dom,
            month,
            dow,
            macro_name: None,
        })
}
