//! `tcps stat`'s text: numbers out of the server's JSON answer, counter
//! differences between two answers, byte counts and right-aligned tables
//! (used by `stat_cmd` and `stat_fabric`).

use serde_json::{Map, Value};

pub fn num(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// `a - b` for every number in `a` (recursively through objects); numbers
/// missing in `b` count as 0.
pub fn delta(a: &Value, b: Option<&Value>) -> Value {
    match a {
        Value::Number(n) => {
            let old = b.and_then(Value::as_u64).unwrap_or(0);
            Value::from(n.as_u64().unwrap_or(0).saturating_sub(old))
        }
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), delta(v, b.and_then(|b| b.get(k)))))
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
}

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n}B");
    }
    let mut x = n as f64 / 1024.0;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < UNITS.len() {
        x /= 1024.0;
        u += 1;
    }
    format!("{x:.1}{}", UNITS[u])
}

/// Right-aligned columns, two spaces apart; the first column left-aligned.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (i, c) in cells.enumerate() {
            if i == 0 {
                s.push_str(&format!("{c:<width$}", width = w[0]));
            } else {
                s.push_str(&format!("  {c:>width$}", width = w[i]));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().copied());
    for r in rows {
        out.push_str(&line(&mut r.iter().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deltas_and_table() {
        let a = json!({"calls": {"Send": 5}, "bytes_sent": 100, "x": "y"});
        let b = json!({"calls": {"Send": 2}, "bytes_sent": 40});
        assert_eq!(
            delta(&a, Some(&b)),
            json!({"calls": {"Send": 3}, "bytes_sent": 60, "x": "y"})
        );
        assert_eq!(delta(&a, None), a);
        assert_eq!(bytes(10), "10B");
        assert_eq!(bytes(1536), "1.5KiB");
        let t = table(&["A", "BB"], &[vec!["x".into(), "1".into()]]);
        assert_eq!(t, "A  BB\nx   1\n");
    }
}
