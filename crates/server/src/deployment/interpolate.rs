//! `${VAR}` in a deployment file: values from the environment, put into
//! the text before it is read (so anywhere: a URL, a model name, a
//! number). `${VAR:-default}` gives a default when `VAR` is unset or
//! empty; `$${` is a literal `${`. An unset variable without a default,
//! a malformed reference, or a value spanning lines is an error at its
//! line and column, all of them listed at once. Comment lines (`# …`) are
//! left as they are.

use rein::config::ConfigError;

/// `text` with every `${…}` replaced by its value (`env` looks a
/// variable up); `Err` lists every reference that cannot be.
pub(crate) fn interpolate(
    text: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<String, Vec<ConfigError>> {
    if !text.contains('$') {
        return Ok(text.to_owned());
    }
    let mut out = String::with_capacity(text.len());
    let mut errors = Vec::new();
    for (index, line) in text.split_inclusive('\n').enumerate() {
        // A comment line is left as it is: an example in a comment must
        // not need its variable set.
        if line.trim_start().starts_with('#') {
            out.push_str(line);
            continue;
        }
        let mut rest = line;
        let mut column = 1;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            column += rest[..at].chars().count();
            let tail = &rest[at..];
            if let Some(after) = tail.strip_prefix("$${") {
                out.push_str("${");
                rest = after;
                column += 3;
                continue;
            }
            let Some(inner) = tail.strip_prefix("${") else {
                out.push('$');
                rest = &tail[1..];
                column += 1;
                continue;
            };
            let at_error = |message: String| ConfigError::at(message, index + 1, column);
            let Some(end) = inner.find('}') else {
                errors.push(at_error(
                    "`${` without its closing `}`: write `${NAME}`, or `$${` for a literal `${`"
                        .to_owned(),
                ));
                out.push_str(tail);
                rest = "";
                break;
            };
            let reference = &inner[..end];
            let (name, default) = match reference.split_once(":-") {
                Some((name, default)) => (name, Some(default)),
                None => (reference, None),
            };
            let valid = name
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                errors.push(at_error(format!(
                    "`${{{reference}}}` does not name an environment variable: use letters, digits and `_` (`${{NAME}}` or `${{NAME:-default}}`)"
                )));
            } else {
                match env(name).filter(|v| !v.is_empty()).or_else(|| default.map(str::to_owned)) {
                    Some(value) if value.contains('\n') => errors.push(at_error(format!(
                        "the environment variable {name} spans lines; a value put into the file must be one line"
                    ))),
                    Some(value) => out.push_str(&value),
                    None => errors.push(at_error(format!(
                        "the environment variable {name} is not set; set it, or give a default: `${{{name}:-default}}`"
                    ))),
                }
            }
            let used = 2 + end + 1;
            column += tail[..used].chars().count();
            rest = &tail[used..];
        }
        out.push_str(rest);
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "MODEL" => Some("gpt-4o-mini".to_owned()),
            "EMPTY" => Some(String::new()),
            "TWO" => Some("a\nb".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn variables_defaults_and_escapes_are_put_into_the_text() {
        let text = "model: ${MODEL}\nfallback: ${EMPTY:-small}\nother: ${UNSET:-x}\nliteral: $${MODEL} costs $5\n";
        assert_eq!(
            interpolate(text, env).unwrap(),
            "model: gpt-4o-mini\nfallback: small\nother: x\nliteral: ${MODEL} costs $5\n"
        );
    }

    #[test]
    fn comment_lines_are_left_as_they_are() {
        let text = "# e.g. base_url: \"${UNSET}\"\n  # ${OPEN\nmodel: ${MODEL} # ${MODEL}\n";
        assert_eq!(
            interpolate(text, env).unwrap(),
            "# e.g. base_url: \"${UNSET}\"\n  # ${OPEN\nmodel: gpt-4o-mini # gpt-4o-mini\n"
        );
    }

    #[test]
    fn every_bad_reference_is_named_at_its_line_and_column() {
        let text = "a: ${UNSET}\nb: x ${TWO}\nc: ${not-a-name}\nd: ${OPEN\n";
        let errors = interpolate(text, env).unwrap_err();
        let shown: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 4, "{shown:#?}");
        assert!(
            shown[0].contains("line 1, column 4") && shown[0].contains("UNSET is not set"),
            "{}",
            shown[0]
        );
        assert!(
            shown[1].contains("line 2, column 6") && shown[1].contains("spans lines"),
            "{}",
            shown[1]
        );
        assert!(
            shown[2].contains("line 3") && shown[2].contains("does not name"),
            "{}",
            shown[2]
        );
        assert!(
            shown[3].contains("line 4") && shown[3].contains("closing"),
            "{}",
            shown[3]
        );
    }
}
