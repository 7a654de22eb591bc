//! The manifest reader: any text to a [`Manifest`] or an error, never a panic
//! (TOML syntax, the manifest's shape, and the path check of every recorded
//! file), then the recorded events as the blueprint reads them. A manifest
//! that is read must also survive a round trip: written with
//! [`Manifest::to_toml`] and read again, it is the same manifest.
#![no_main]

use gpkit::domain::events::EventView;
use gpkit::engine::manifest::Manifest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(manifest) = Manifest::parse(text) else {
        return;
    };
    for event in &manifest.components.events {
        let _ = EventView::new(event);
    }
    let written = manifest.to_toml();
    let back = Manifest::parse(&written)
        .unwrap_or_else(|err| panic!("the written manifest is not read back: {err:#}\n{written}"));
    assert_eq!(back, manifest, "the manifest changed in a round trip");
});
