//! `tcps stat`'s FABRIC table: each remote host's link (address, up or
//! lost and why, time since its last message, messages and bytes each
//! way) and the totals over every link, from the answer's `fabric`
//! (`docs/PROTOCOL.md`).

use serde_json::Value;

use crate::stat_text::{bytes, delta, num, table};

/// Milliseconds as `12ms`, `3.4s`.
fn age(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

/// The FABRIC table: each remote host's link (address, state, last heard,
/// messages and bytes each way) and the totals over every link; nothing
/// when the server has no fabric listener. With `prev`, counters are
/// differences since that answer.
pub fn fabric_section(v: &Value, prev: Option<&Value>) -> String {
    let f = &v["fabric"];
    let Some(listen) = f["listen"].as_str() else {
        return String::new();
    };
    let old = |h: &Value| -> Option<Value> {
        let prev = prev?["fabric"]["hosts"].as_array()?;
        let p = prev.iter().find(|p| num(p, "host") == num(h, "host"))?;
        Some(p["counters"].clone())
    };
    let counters = |c: &Value, old: Option<Value>| match prev {
        Some(_) => delta(c, old.as_ref()),
        None => c.clone(),
    };
    let cells = |c: &Value| {
        vec![
            format!(
                "{}/{}",
                num(c, "messages_sent"),
                num(c, "messages_received")
            ),
            format!(
                "{}/{}",
                bytes(num(c, "bytes_sent")),
                bytes(num(c, "bytes_received"))
            ),
        ]
    };
    let mut rows = Vec::new();
    for h in f["hosts"].as_array().into_iter().flatten() {
        let state = h["state"].as_str().unwrap_or("-");
        let link = match h["why"].as_str() {
            Some(why) => format!("{state} ({why})"),
            None => state.to_string(),
        };
        let mut r = vec![
            format!("host {}", num(h, "host")),
            num(h, "pid").to_string(),
            num(h, "uid").to_string(),
            h["addr"].as_str().unwrap_or("-").to_string(),
            link,
            age(num(h, "last_heard_ms")),
        ];
        r.extend(cells(&counters(&h["counters"], old(h))));
        rows.push(r);
    }
    let total_old = prev.map(|p| p["fabric"]["total"].clone());
    let mut total = vec!["TOTAL".to_string()];
    total.extend(std::iter::repeat_n(String::new(), 5));
    total.extend(cells(&counters(&f["total"], total_old)));
    rows.push(total);
    let mut out = format!(
        "\nfabric listener {listen}: {} remote hosts up, {} lost so far\n",
        num(f, "hosts_up"),
        num(f, "hosts_lost")
    );
    out.push_str(&table(
        &[
            "FABRIC",
            "PID",
            "UID",
            "ADDRESS",
            "LINK",
            "HEARD",
            "MSGS o/i",
            "BYTES o/i",
        ],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fabric_table() {
        let link = |host: u64, sent: u64, state: &str| {
            json!({"host": host, "pid": 42, "uid": 65534, "addr": "10.78.0.2:40000",
                   "state": state, "last_heard_ms": 1500,
                   "counters": {"messages_sent": sent, "bytes_sent": 2048,
                                "messages_received": 3, "bytes_received": 10}})
        };
        let mut lost = link(2, 1, "lost");
        lost["why"] = json!("silent for 800ms");
        let v = json!({"fabric": {"listen": "10.78.0.1:7010", "hosts_up": 1, "hosts_lost": 1,
            "hosts": [link(1, 7, "up"), lost],
            "total": {"messages_sent": 8, "bytes_sent": 4096, "messages_received": 6,
                      "bytes_received": 20}}});
        let t = fabric_section(&v, None);
        assert!(
            t.contains("fabric listener 10.78.0.1:7010: 1 remote hosts up, 1 lost"),
            "{t}"
        );
        let row = t.lines().find(|l| l.starts_with("host 1 ")).unwrap();
        for cell in ["10.78.0.2:40000", "up", "1.5s", "7/3", "2.0KiB/10B"] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        assert!(t.contains("lost (silent for 800ms)"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.starts_with("TOTAL") && l.contains("8/6")),
            "{t}"
        );
        // With an earlier answer: what the counters did since.
        let mut now = v.clone();
        now["fabric"]["hosts"][0]["counters"]["messages_sent"] = json!(10);
        now["fabric"]["total"]["messages_sent"] = json!(11);
        let t = fabric_section(&now, Some(&v));
        let row = t.lines().find(|l| l.starts_with("host 1 ")).unwrap();
        assert!(row.contains("3/0"), "{row}");
        // No fabric listener: no section.
        assert_eq!(
            fabric_section(&json!({"fabric": {"listen": null}}), None),
            ""
        );
    }
}
