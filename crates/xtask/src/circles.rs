//! Import circles between the modules of one crate.
//!
//! A module depends on another when its product code (not `#[cfg(test)]`) names it by a path:
//! `crate::a::b`, `super::x` or `self::y`, in a `use`, anywhere else, or in a doc comment (an
//! intra-doc link sends the reader there as surely as an import). A module naming its own
//! ancestors or descendants does not count: a parent declares its children and they see its items
//! by design. Modules that depend on each other, directly or through others, form a circle: no
//! reader can take them in an order where each comes after what it uses.
//!
//! Ours because the tools that draw a crate's module graph (`cargo modules`) are built on
//! rust-analyzer, a long build for one check; `syn` reads every path the same way the compiler
//! writes it, and `petgraph` finds the strongly connected components.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use petgraph::graphmap::DiGraphMap;
use syn::visit::Visit;

/// A module's path from its crate's root, e.g. `["kinds", "pods"]`; empty for the root.
pub type ModulePath = Vec<String>;

/// Why a crate could not be read.
#[derive(Debug)]
pub enum Error {
    Read(PathBuf, std::io::Error),
    Parse(PathBuf, syn::Error),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Read(path, e) => write!(f, "reading {}: {e}", path.display()),
            Error::Parse(path, e) => {
                let at = e.span().start();
                write!(f, "{}:{}: {e}", path.display(), at.line)
            }
        }
    }
}

/// One module naming another: where (file and line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Use {
    pub from: ModulePath,
    pub to: ModulePath,
    pub file: PathBuf,
    pub line: usize,
}

/// A circle: its modules, and the uses that tie them (the first of each pair of modules).
#[derive(Debug)]
pub struct Circle {
    pub modules: Vec<ModulePath>,
    pub uses: Vec<Use>,
}

/// The circles among the modules of the crate whose sources are under `src`.
pub fn of_crate(src: &Path) -> Result<Vec<Circle>, Error> {
    let files = module_files(src)?;
    let mut parsed = BTreeMap::new();
    for (module, file) in &files {
        let text = std::fs::read_to_string(file).map_err(|e| Error::Read(file.clone(), e))?;
        let ast = syn::parse_file(&text).map_err(|e| Error::Parse(file.clone(), e))?;
        parsed.insert(module.clone(), (file.clone(), ast));
    }
    // Files of `#[cfg(test)] mod x;` are test code, as their declaration says.
    let mut tests = BTreeSet::new();
    for (module, (_, ast)) in &parsed {
        for item in &ast.items {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
                && is_test(&m.attrs)
            {
                let mut child = module.clone();
                child.push(m.ident.to_string());
                tests.insert(child);
            }
        }
    }
    let known: BTreeSet<ModulePath> = files
        .keys()
        .filter(|m| !tests.iter().any(|t| m.starts_with(t)))
        .cloned()
        .collect();
    let mut uses = Vec::new();
    for (module, (file, ast)) in parsed.iter().filter(|(m, _)| known.contains(*m)) {
        uses.extend(uses_in(module, file, ast, &known));
    }
    Ok(circles(&known, &uses))
}

/// The strongly connected components of more than one module, with the uses inside each.
pub fn circles(modules: &BTreeSet<ModulePath>, uses: &[Use]) -> Vec<Circle> {
    let index: Vec<&ModulePath> = modules.iter().collect();
    let id = |m: &ModulePath| index.iter().position(|x| *x == m);
    let mut graph = DiGraphMap::<usize, ()>::new();
    for n in 0..index.len() {
        graph.add_node(n);
    }
    for u in uses {
        if let (Some(a), Some(b)) = (id(&u.from), id(&u.to)) {
            graph.add_edge(a, b, ());
        }
    }
    let mut found: Vec<Circle> = petgraph::algo::tarjan_scc(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut members: Vec<ModulePath> = c.iter().map(|&n| index[n].clone()).collect();
            members.sort();
            let mut inside: Vec<Use> = Vec::new();
            for u in uses {
                let tied = members.contains(&u.from) && members.contains(&u.to);
                if tied && !inside.iter().any(|i| i.from == u.from && i.to == u.to) {
                    inside.push(u.clone());
                }
            }
            Circle {
                modules: members,
                uses: inside,
            }
        })
        .collect();
    found.sort_by(|a, b| a.modules.cmp(&b.modules));
    found
}

/// Every `.rs` file under `src` by the module it holds (`a/mod.rs` and `a.rs` are `a`; `lib.rs`
/// and `main.rs` the root).
fn module_files(src: &Path) -> Result<BTreeMap<ModulePath, PathBuf>, Error> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| Error::Read(dir.clone(), e))?;
        for entry in entries {
            let path = entry.map_err(|e| Error::Read(dir.clone(), e))?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.insert(module_of(src, &path), path);
            }
        }
    }
    Ok(out)
}

fn module_of(src: &Path, file: &Path) -> ModulePath {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: ModulePath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| ["mod", "lib", "main"].contains(&l.as_str()))
    {
        parts.pop();
    }
    parts
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        (a.path().is_ident("cfg")
            && a.meta
                .require_list()
                .is_ok_and(|l| l.tokens.to_string() == "test"))
            || a.path().is_ident("test")
    })
}

/// The other modules of `known` that `module`'s file names.
pub fn uses_in(
    module: &ModulePath,
    file: &Path,
    ast: &syn::File,
    known: &BTreeSet<ModulePath>,
) -> Vec<Use> {
    let mut reader = Reader {
        file_module: module.clone(),
        here: module.clone(),
        file,
        known,
        found: Vec::new(),
    };
    reader.visit_file(ast);
    reader.found
}

struct Reader<'a> {
    /// The module the file holds.
    file_module: ModulePath,
    /// The module the code being read is in (deeper inside an inline `mod x { … }`).
    here: ModulePath,
    file: &'a Path,
    known: &'a BTreeSet<ModulePath>,
    found: Vec<Use>,
}

impl Reader<'_> {
    /// Note a path (its segments' names, and where it is).
    fn path(&mut self, segments: &[String], line: usize) {
        let Some(first) = segments.first() else {
            return;
        };
        let absolute: ModulePath = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "self" => self.here.iter().chain(&segments[1..]).cloned().collect(),
            "super" => {
                let ups = segments.iter().take_while(|s| *s == "super").count();
                let Some(keep) = self.here.len().checked_sub(ups) else {
                    return;
                };
                self.here[..keep]
                    .iter()
                    .chain(&segments[ups..])
                    .cloned()
                    .collect()
            }
            _ => return,
        };
        let Some(target) = (0..=absolute.len())
            .rev()
            .map(|k| absolute[..k].to_vec())
            .find(|p| self.known.contains(p))
        else {
            return;
        };
        let from = &self.file_module;
        if target.starts_with(from) || from.starts_with(&target) {
            return;
        }
        self.found.push(Use {
            from: from.clone(),
            to: target,
            file: self.file.to_path_buf(),
            line,
        });
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, line: usize) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut full = prefix.clone();
                if n.ident != "self" {
                    full.push(n.ident.to_string());
                }
                self.path(&full, line);
            }
            syn::UseTree::Rename(r) => {
                let mut full = prefix.clone();
                if r.ident != "self" {
                    full.push(r.ident.to_string());
                }
                self.path(&full, line);
            }
            syn::UseTree::Glob(_) => self.path(&prefix.clone(), line),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t, line);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Reader<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if !is_test(attrs) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.here.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.here.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let line = u.use_token.span.start().line;
        self.use_tree(&mut Vec::new(), &u.tree, line);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p
            .segments
            .first()
            .map(|s| s.ident.span().start().line)
            .unwrap_or(0);
        self.path(&segments, line);
        syn::visit::visit_path(self, p);
    }

    fn visit_attribute(&mut self, a: &'ast syn::Attribute) {
        if let syn::Meta::NameValue(nv) = &a.meta
            && nv.path.is_ident("doc")
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) = &nv.value
        {
            let line = text.span().start().line;
            for segments in paths_in_text(&text.value()) {
                self.path(&segments, line);
            }
        }
        syn::visit::visit_attribute(self, a);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        // A macro's body is tokens, not paths: read the paths written in it as tokens.
        let tokens: Vec<proc_macro2::TokenTree> = m.tokens.clone().into_iter().collect();
        self.macro_tokens(&tokens);
        syn::visit::visit_macro(self, m);
    }
}

impl Reader<'_> {
    /// Paths such as `crate::a::b` written inside a macro's tokens (`format!`, `tokio::select!`).
    fn macro_tokens(&mut self, tokens: &[proc_macro2::TokenTree]) {
        use proc_macro2::TokenTree;
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(g) => {
                    let inner: Vec<TokenTree> = g.stream().into_iter().collect();
                    self.macro_tokens(&inner);
                    i += 1;
                }
                TokenTree::Ident(id)
                    if ["crate", "super", "self"].contains(&id.to_string().as_str()) =>
                {
                    let line = id.span().start().line;
                    let mut segments = vec![id.to_string()];
                    let mut j = i + 1;
                    while let (
                        Some(TokenTree::Punct(a)),
                        Some(TokenTree::Punct(b)),
                        Some(TokenTree::Ident(next)),
                    ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                    {
                        if a.as_char() != ':' || b.as_char() != ':' {
                            break;
                        }
                        segments.push(next.to_string());
                        j += 3;
                    }
                    self.path(&segments, line);
                    i = j.max(i + 1);
                }
                _ => i += 1,
            }
        }
    }
}

/// The paths written in prose (`[`crate::a::b`]`, `super::x`): each run of identifiers joined
/// by `::` that starts with `crate`, `super` or `self`.
fn paths_in_text(text: &str) -> Vec<Vec<String>> {
    let word = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = ["crate::", "super::", "self::"]
        .iter()
        .filter_map(|start| rest.find(start))
        .min()
    {
        let before = rest[..at].chars().next_back();
        let tail = &rest[at..];
        let end = tail
            .char_indices()
            .find(|&(i, c)| {
                !(word(c)
                    || (c == ':' && tail[i..].starts_with("::"))
                    || (c == ':' && i > 0 && tail[..i].ends_with(':')))
            })
            .map_or(tail.len(), |(i, _)| i);
        if !before.is_some_and(word) {
            let segments: Vec<String> = tail[..end]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            found.push(segments);
        }
        rest = &tail[end.max(1)..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(path: &str) -> ModulePath {
        path.split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }

    fn read(module: &str, text: &str, known: &[&str]) -> Vec<(String, usize)> {
        let known: BTreeSet<ModulePath> = known.iter().map(|k| m(k)).collect();
        let ast = syn::parse_file(text).unwrap();
        uses_in(&m(module), Path::new("x.rs"), &ast, &known)
            .into_iter()
            .map(|u| (u.to.join("::"), u.line))
            .collect()
    }

    #[test]
    fn every_way_of_naming_a_module_counts_and_tests_do_not() {
        let known = ["", "a", "a::b", "c", "c::d", "e"];
        let text = "use crate::c::d::Thing;\n\
                    use super::{b, super::e};\n\
                    fn f() { crate::c::go(); let _ = format!(\"{}\", crate::e::X); }\n\
                    #[cfg(test)] mod tests { use crate::c::Other; }\n\
                    #[test] fn t() { crate::c::go(); }\n\
                    /// See [`crate::c::d::Thing`] and [`super::super::e`].\n\
                    fn g() {}\n";
        let found = read("a::b", text, &known);
        assert_eq!(
            found,
            vec![
                ("c::d".to_string(), 1),
                ("e".to_string(), 2),
                ("c".to_string(), 3),
                ("e".to_string(), 3),
                ("c::d".to_string(), 6),
                ("e".to_string(), 6),
            ]
        );
    }

    #[test]
    fn parents_and_children_are_not_circles() {
        let known = ["", "a", "a::b"];
        assert!(read("a", "use self::b::X; fn f() { b::g(); }", &known).is_empty());
        assert!(read("a::b", "use super::X; use crate::Error;", &known).is_empty());
    }

    #[test]
    fn a_circle_is_found_with_the_uses_that_make_it() {
        let modules: BTreeSet<ModulePath> = ["", "a", "b", "c", "d"].iter().map(|k| m(k)).collect();
        let uses: Vec<Use> = [("a", "b", 1), ("b", "c", 2), ("c", "a", 3), ("c", "d", 4)]
            .iter()
            .map(|(f, t, l)| Use {
                from: m(f),
                to: m(t),
                file: PathBuf::from(format!("{f}.rs")),
                line: *l,
            })
            .collect();
        let found = circles(&modules, &uses);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].modules, vec![m("a"), m("b"), m("c")]);
        assert_eq!(found[0].uses.len(), 3);
        assert!(circles(&modules, &uses[..2]).is_empty());
    }
}
