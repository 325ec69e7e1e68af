//! Unit tests of the dialect vocabulary.

use super::*;

fn parse(text: &str) -> Result<Dialect, String> {
    let value = serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text);
    Dialect::deserialize(value).map_err(|e| e.to_string())
}

#[test]
fn configuration_names_each_dialect_by_its_tool_name() {
    for d in Dialect::ALL {
        assert_eq!(parse(d.name()), Ok(*d));
        assert_eq!(d.to_string(), d.name());
    }
}

#[test]
fn a_misspelt_dialect_is_refused_naming_the_accepted_ones() {
    for bad in ["zsh", "Bash", "PWSH", "powershell", ""] {
        let e = parse(bad).unwrap_err();
        assert!(e.contains("`bash`") && e.contains("`pwsh`"), "{bad}: {e}");
    }
}

#[test]
fn only_bash_has_the_usual_exit_code_rule() {
    assert_eq!(Dialect::Bash.exit_status(), "");
    assert!(Dialect::Pwsh.exit_status().contains("$LASTEXITCODE"));
}
