//! Work classes: requests matched by method and path pattern to a cost in tokens.

use super::format::MAX_COST;

/// One class: `METHOD PATTERN=COST`, `*` for any method; `*` in the pattern matches any
/// run of characters (`/export/*`, `*.csv`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Class {
    /// The text as given, for reports.
    pub(crate) spec: String,
    method: Option<String>,
    pattern: String,
    /// Tokens a matching request costs.
    pub(crate) cost: u64,
}

impl Class {
    /// Parses `METHOD PATTERN=COST` (`POST /export/*=20`, `* /search*=3`) or
    /// `PATTERN=COST` (any method).
    pub(crate) fn parse(text: &str) -> Result<Class, String> {
        let bad = |why: &str| {
            format!(
                "a work class is METHOD PATTERN=COST (e.g. `POST /export/*=20`): {why}, got `{text}`"
            )
        };
        let (lhs, cost) = text.rsplit_once('=').ok_or_else(|| bad("no `=COST`"))?;
        let cost = match cost.trim().parse::<u64>() {
            Ok(c) if (1..=MAX_COST).contains(&c) => c,
            _ => {
                return Err(bad(&format!(
                    "the cost must be a whole number of tokens from 1 to {MAX_COST}"
                )));
            }
        };
        let lhs = lhs.trim();
        let (method, pattern) = match lhs.split_once(char::is_whitespace) {
            Some((m, p)) => (m, p.trim()),
            None => ("*", lhs),
        };
        if pattern.is_empty() {
            return Err(bad("the path pattern is empty"));
        }
        Ok(Class {
            spec: text.trim().to_string(),
            method: (method != "*").then(|| method.to_ascii_uppercase()),
            pattern: pattern.to_string(),
            cost,
        })
    }

    /// Whether a request with this method and path (without query) is in the class.
    pub(crate) fn matches(&self, method: &str, path: &str) -> bool {
        self.method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && glob(&self.pattern, path)
    }
}

/// The classes in order, and what a request matching none of them costs.
#[derive(Clone, Debug)]
pub(crate) struct Classes {
    pub(crate) list: Vec<Class>,
    pub(crate) default_cost: u64,
    /// Requests each class matched.
    pub(crate) matched: Vec<u64>,
}

impl Classes {
    pub(crate) fn new(list: Vec<Class>, default_cost: u64) -> Classes {
        let matched = vec![0; list.len()];
        Classes {
            list,
            default_cost,
            matched,
        }
    }

    /// The cost of a request: the first matching class's, else the default; counts the
    /// match.
    pub(crate) fn cost(&mut self, method: &str, path: &str) -> u64 {
        for (i, class) in self.list.iter().enumerate() {
            if class.matches(method, path) {
                self.matched[i] += 1;
                return class.cost;
            }
        }
        self.default_cost
    }

    /// An error when classes were given and none matched a single request: the mapping
    /// is surely wrong (a typo, or a format whose lines carry no method or path).
    pub(crate) fn check_matched(&self) -> Result<(), String> {
        if !self.list.is_empty() && self.matched.iter().all(|&n| n == 0) {
            let specs: Vec<&str> = self.list.iter().map(|c| c.spec.as_str()).collect();
            return Err(format!(
                "no request matched any work class ({}): check the method and path patterns",
                specs.join("; ")
            ));
        }
        Ok(())
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters and
/// everything else matches itself; the classic two-pointer backtrack, no recursion and
/// no allocation.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_and_literals() {
        assert!(glob("/export/*", "/export/a/b"));
        assert!(glob("/export/*", "/export/"));
        assert!(!glob("/export/*", "/export"));
        assert!(glob("*.csv", "/a/b.csv"));
        assert!(!glob("*.csv", "/a/b.csvx"));
        assert!(glob("/a*b*c", "/aXbYbZc"));
        assert!(glob("*", ""));
        assert!(!glob("/a", "/ab"));
    }

    #[test]
    fn the_first_matching_class_sets_the_cost() {
        let mut c = Classes::new(
            vec![
                Class::parse("POST /export/*=20").unwrap(),
                Class::parse("/export/*=5").unwrap(),
                Class::parse("get /search*=3").unwrap(),
            ],
            1,
        );
        assert_eq!(c.cost("POST", "/export/x"), 20);
        assert_eq!(c.cost("GET", "/export/x"), 5);
        assert_eq!(c.cost("GET", "/search"), 3);
        assert_eq!(c.cost("POST", "/search"), 1);
        assert_eq!(c.cost("", ""), 1);
        assert_eq!(c.matched, vec![1, 1, 1]);
        assert_eq!(c.check_matched(), Ok(()));
    }

    #[test]
    fn a_mapping_that_matches_nothing_is_an_error() {
        let mut c = Classes::new(vec![Class::parse("POST /exprot/*=20").unwrap()], 1);
        c.cost("POST", "/export/1");
        let err = c.check_matched().unwrap_err();
        assert!(err.contains("POST /exprot/*=20"), "{err}");
        assert_eq!(Classes::new(vec![], 1).check_matched(), Ok(()));
    }

    #[test]
    fn bad_classes_name_the_format_and_the_range() {
        for (text, why) in [
            ("POST /export", "no `=COST`"),
            ("POST /export=0", "from 1 to"),
            ("POST /export=x", "from 1 to"),
            ("=3", "pattern is empty"),
        ] {
            let err = Class::parse(text).unwrap_err();
            assert!(err.contains(why) && err.contains(text), "{text}: {err}");
        }
    }
}
