//! Bounded text: whatever the operator writes from tenant input into a condition, an Event or an
//! annotation is cut to [`MAX_TEXT_BYTES`], saying how much was cut. A tenant object with a
//! thousand refusals, or names a page long, must not grow the host's objects with it.

/// The most bytes of one such text: the API's own limit for an Event's note, and plenty for a
/// sentence a person reads.
pub const MAX_TEXT_BYTES: usize = 1024;

/// `text`, at most [`MAX_TEXT_BYTES`] long.
pub fn bounded(text: &str) -> String {
    bounded_to(text, MAX_TEXT_BYTES)
}

/// `text`, at most `max` bytes long: cut on a character boundary and ended with
/// `… (12,345 more characters cut)`, the whole within `max`.
pub fn bounded_to(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let total = text.chars().count();
    // The note for every character is the longest it can be: what is kept leaves room for it.
    let Some(budget) = max.checked_sub(cut_note(total).len()) else {
        return text[..floor_boundary(text, max)].to_string();
    };
    let kept = &text[..floor_boundary(text, budget)];
    let cut = total - kept.chars().count();
    format!("{kept}{}", cut_note(cut))
}

/// Up to `show` of `items` joined by `; `, as many as fit in [`MAX_TEXT_BYTES`], then how many
/// more there are: `a; b; and 17 more {what}s` (`what` is singular: `and 1 more reason`). A tenant object can give thousands of reasons; a
/// person reads the first few, and the count always survives the bound.
pub fn capped_list(items: &[String], show: usize, what: &str) -> String {
    // Room for `; and 1,234,567 more <what>`.
    let budget = MAX_TEXT_BYTES.saturating_sub(32 + what.len());
    let mut out = String::new();
    let mut shown = 0;
    for item in items.iter().take(show) {
        let separator = if shown == 0 { 0 } else { 2 };
        if out.len() + separator + item.len() > budget {
            if shown == 0 {
                out = bounded_to(item, budget);
                shown = 1;
            }
            break;
        }
        if shown > 0 {
            out.push_str("; ");
        }
        out.push_str(item);
        shown += 1;
    }
    let more = items.len() - shown;
    if more > 0 {
        if !out.is_empty() {
            out.push_str("; ");
        }
        let plural = if more == 1 { "" } else { "s" };
        out.push_str(&format!("and {} more {what}{plural}", grouped(more)));
    }
    out
}

fn cut_note(characters: usize) -> String {
    format!("… ({} more characters cut)", grouped(characters))
}

/// The largest character boundary of `text` at or below `at`.
fn floor_boundary(text: &str, at: usize) -> usize {
    let mut i = at.min(text.len());
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// `12345` as `12,345`.
fn grouped(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_as_it_is() {
        assert_eq!(bounded("refused"), "refused");
        assert_eq!(bounded(""), "");
        let exact = "x".repeat(MAX_TEXT_BYTES);
        assert_eq!(bounded(&exact), exact);
    }

    #[test]
    fn long_text_is_cut_within_the_bound_and_says_how_much() {
        let long = "x".repeat(411_438);
        let cut = bounded(&long);
        assert!(cut.len() <= MAX_TEXT_BYTES, "{}", cut.len());
        assert!(cut.len() > MAX_TEXT_BYTES - 40, "keeps what fits");
        let kept = cut.chars().take_while(|c| *c == 'x').count();
        assert_eq!(
            cut,
            format!(
                "{}… ({} more characters cut)",
                "x".repeat(kept),
                grouped(411_438 - kept)
            )
        );
        assert!(cut.ends_with("more characters cut)"));
        let one_over = "y".repeat(MAX_TEXT_BYTES + 1);
        let cut = bounded(&one_over);
        assert!(cut.len() <= MAX_TEXT_BYTES);
        assert!(cut.contains("more characters cut"), "{cut}");
    }

    #[test]
    fn cuts_fall_on_character_boundaries_and_count_characters() {
        // Four bytes each: no cut point lands inside one, and the count is of characters.
        let crabs = "🦀".repeat(1000);
        for max in [5, 37, 38, 39, 40, 41, 100, 1023, 1024] {
            let cut = bounded_to(&crabs, max);
            assert!(cut.len() <= max, "{max}: {}", cut.len());
            let kept = cut.chars().take_while(|c| *c == '🦀').count();
            if cut.contains("cut)") {
                assert!(
                    cut.ends_with(&format!("({} more characters cut)", grouped(1000 - kept))),
                    "{cut}"
                );
            }
        }
        let mixed = format!("é{}", "ü".repeat(2000));
        let cut = bounded(&mixed);
        assert!(cut.len() <= MAX_TEXT_BYTES && cut.starts_with('é'));
    }

    #[test]
    fn a_bound_too_small_for_the_note_still_holds() {
        assert_eq!(bounded_to("abcdefghij", 4), "abcd");
        assert_eq!(bounded_to("ééé", 3), "é");
        assert_eq!(bounded_to("abc", 0), "");
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(12_345), "12,345");
        assert_eq!(grouped(1_234_567), "1,234,567");
    }

    #[test]
    fn lists_show_the_first_few_and_count_the_rest() {
        let items: Vec<String> = (1..=20).map(|i| format!("r{i}")).collect();
        assert_eq!(
            capped_list(&items, 3, "reason"),
            "r1; r2; r3; and 17 more reasons"
        );
        assert_eq!(capped_list(&items[..2], 3, "reason"), "r1; r2");
        assert_eq!(capped_list(&[], 3, "reason"), "");
        let many: Vec<String> = (0..1500).map(|i| i.to_string()).collect();
        assert!(capped_list(&many, 1, "reason").ends_with("and 1,499 more reasons"));
    }

    #[test]
    fn long_items_leave_the_count_within_the_bound() {
        let long: Vec<String> = (0..700)
            .map(|i| format!("{i}:{}", "x".repeat(300)))
            .collect();
        let list = capped_list(&long, 5, "reason");
        assert!(list.len() <= MAX_TEXT_BYTES, "{}", list.len());
        assert!(
            list.starts_with("0:xxx") && list.contains("; 2:xxx"),
            "{list}"
        );
        assert!(list.ends_with("; and 697 more reasons"), "{list}");
        let huge = vec!["y".repeat(100_000), "z".into()];
        let list = capped_list(&huge, 5, "reason");
        assert!(list.len() <= MAX_TEXT_BYTES, "{}", list.len());
        assert!(
            list.ends_with("more characters cut); and 1 more reason"),
            "{}",
            &list[list.len() - 60..]
        );
    }
}
