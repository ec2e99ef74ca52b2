use super::*;
use crate::sim::tiers::TierTable;

fn tiers() -> TierTable {
    TierTable::builtin().expect("tiers")
}

fn jsonl(text: &str) -> anyhow::Result<FileTrace> {
    parse("a.jsonl", text, false, &tiers())
}

fn error(text: &str) -> String {
    format!("{:#}", jsonl(text).expect_err("malformed"))
}

const GOOD: &str = r#"# a comment
{"t": 0.5, "tenant": "acme", "tier": "standard", "prompt_tokens": 800, "output_tokens": 200, "session": "s1"}

{"t": 0.5, "tenant": "bob", "tier": "free", "prompt_tokens": 10, "output_tokens": 5, "model": "x"}
{"t": 2, "tenant": "acme", "tier": "standard", "prompt_tokens": 1100, "output_tokens": 50, "session": "s1"}
"#;

#[test]
fn a_good_file_numbers_tenants_and_sessions_in_order() {
    let t = jsonl(GOOD).expect("good");
    assert_eq!(t.arrivals.len(), 3);
    assert_eq!(t.tenant_tiers, [1, 2]);
    assert_eq!(t.sessions, 1);
    let a = t.arrivals[2];
    assert_eq!((a.t_us, a.tenant, a.tier, a.session), (2_000_000, 0, 1, 0));
    assert_eq!((a.prompt_tokens, a.output_tokens), (1100, 50));
    assert_eq!(t.arrivals[1].session, NO_SESSION);
}

#[test]
fn csv_takes_the_same_columns_in_any_order() {
    let text = "# c\nt,tier,tenant,output_tokens,prompt_tokens,session\n\n0.5,standard,acme,200,800,s1\n1,free,bob,5,10,\n";
    let t = parse("a.csv", text, true, &tiers()).expect("csv");
    assert_eq!(t.arrivals.len(), 2);
    assert_eq!(t.arrivals[0].prompt_tokens, 800);
    assert_eq!(t.arrivals[1].session, NO_SESSION);
    let without_session = "t,tenant,tier,prompt_tokens,output_tokens\n3,acme,enterprise,1,1\n";
    assert!(parse("b.csv", without_session, true, &tiers()).is_ok());
}

#[test]
fn each_malformed_line_is_named_with_what_is_wrong() {
    let line = |s: &str| {
        format!(
            "{{\"t\": 1, \"tenant\": \"a\", \"tier\": \"free\", \"prompt_tokens\": 1, \"output_tokens\": 1}}\n{s}\n"
        )
    };
    let cases = [
        (
            line(r#"{"t": 2, "tenant": "a", "prompt_tokens": 1, "output_tokens": 1}"#),
            "a.jsonl:2: missing field \"tier\"",
        ),
        (
            line(
                r#"{"t": 2, "tenant": "a", "tier": "gold", "prompt_tokens": 1, "output_tokens": 1}"#,
            ),
            "a.jsonl:2: unknown tier \"gold\"",
        ),
        (
            line(
                r#"{"t": 0.5, "tenant": "a", "tier": "free", "prompt_tokens": 1, "output_tokens": 1}"#,
            ),
            "a.jsonl:2: t = 0.5 is before",
        ),
        (
            line(
                r#"{"t": 2, "tenant": "a", "tier": "free", "prompt_tokens": 1.5, "output_tokens": 1}"#,
            ),
            "a.jsonl:2: field \"prompt_tokens\" must be an integer",
        ),
        (
            line(
                r#"{"t": 2, "tenant": "a", "tier": "free", "prompt_tokens": 1, "output_tokens": 0}"#,
            ),
            "a.jsonl:2: field \"output_tokens\" must be an integer ≥ 1",
        ),
        (
            line(
                r#"{"t": -1, "tenant": "a", "tier": "free", "prompt_tokens": 1, "output_tokens": 1}"#,
            ),
            "a.jsonl:2: field \"t\" must be a non-negative",
        ),
        (
            line(
                r#"{"t": "2", "tenant": "a", "tier": "free", "prompt_tokens": 1, "output_tokens": 1}"#,
            ),
            "a.jsonl:2: field \"t\" must be a number",
        ),
        (
            line(
                r#"{"t": 2, "tenant": "a", "tier": "standard", "prompt_tokens": 1, "output_tokens": 1}"#,
            ),
            "a.jsonl:2: tenant \"a\" is tier \"standard\" here but \"free\" on line 1",
        ),
        (line("not json"), "a.jsonl:2: not a JSON object"),
        (line("[1, 2]"), "a.jsonl:2: not a JSON object"),
    ];
    for (text, want) in cases {
        let e = error(&text);
        assert!(e.starts_with(want), "{e:?} does not start with {want:?}");
    }
    let csv = "t,tenant,tier,prompt_tokens,output_tokens\n1,a,free,1,1\n2,a,,1,1\n";
    let e = format!(
        "{:#}",
        parse("a.csv", csv, true, &tiers()).expect_err("empty tier")
    );
    assert!(e.starts_with("a.csv:3: missing field \"tier\""), "{e}");
    let short = "t,tenant,tier,prompt_tokens,output_tokens\n1,a,free\n";
    let e = format!(
        "{:#}",
        parse("a.csv", short, true, &tiers()).expect_err("short row")
    );
    assert!(e.starts_with("a.csv:2: 3 cells"), "{e}");
    let e = format!(
        "{:#}",
        parse("a.csv", "t,tenant\n", true, &tiers()).expect_err("header")
    );
    assert!(
        e.starts_with("a.csv:1: CSV header lacks column \"tier\""),
        "{e}"
    );
}

#[test]
fn an_empty_trace_is_an_error() {
    assert!(error("# only a comment\n\n").contains("empty trace"));
    let e = format!(
        "{:#}",
        parse("a.csv", "# nothing\n", true, &tiers()).expect_err("empty")
    );
    assert!(e.contains("no header"), "{e}");
}

#[test]
fn the_format_follows_the_extension_or_the_content() {
    let dir = std::env::temp_dir().join(format!("tidegate-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let csv = "t,tenant,tier,prompt_tokens,output_tokens\n1,a,free,1,1\n";
    for (name, text) in [
        ("a.csv", csv),
        ("a.txt", csv),
        ("b.txt", GOOD),
        ("c.jsonl", GOOD),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        assert!(load(&p, &tiers()).is_ok(), "{name}");
    }
    let e = format!(
        "{:#}",
        load(&dir.join("missing.jsonl"), &tiers()).expect_err("missing")
    );
    assert!(
        e.contains("reading trace file") && e.contains("missing.jsonl"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
