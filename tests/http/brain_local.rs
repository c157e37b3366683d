//! The `local` brain: OCR of a real sign image with the `tesseract` program,
//! the fallback to the moment's text, and "nothing to read".
//!
//! The OCR tests need `tesseract` (`apt-get install -y tesseract-ocr`); without
//! it they print that they skipped and why, and pass, unless
//! `SPARK_REQUIRE_OCR=1` is set (as `.ci/run` does): then they fail.

use std::path::PathBuf;

use crate::common;

use spark_engine::brain::local::{LocalBrain, LocalConfig};
use spark_engine::brain::{Brain, BrainRequest, CopyImage};

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A brain that will run tesseract, or `None` when the test should be
/// skipped: tesseract is missing and `SPARK_REQUIRE_OCR` is not `1` (the
/// skip is printed with its reason). With `SPARK_REQUIRE_OCR=1` (`.ci/run`
/// sets it) a missing tesseract fails the test.
fn ocr_brain(test: &str) -> Option<LocalBrain> {
    let brain = LocalBrain::new(LocalConfig::default());
    let missing = brain
        .tesseract_program()
        .err()
        .map(|why| format!("{why} (apt-get install tesseract-ocr tesseract-ocr-eng)"));
    common::run_or_skip(test, missing, "SPARK_REQUIRE_OCR").then_some(brain)
}

fn sign(name: &str) -> CopyImage {
    CopyImage {
        bytes: fixture(name),
        content_type: "image/png".into(),
    }
}

fn sign_request(text: Option<&str>) -> BrainRequest {
    BrainRequest {
        moment_text: text.map(Into::into),
        copies: vec![sign("sign.png")],
        mode: "practical".into(),
        ..BrainRequest::default()
    }
}

#[tokio::test]
async fn ocr_reads_the_sign_image() {
    let Some(brain) = ocr_brain("brain_local::ocr_reads_the_sign_image") else {
        return;
    };
    let answer = brain.read(sign_request(None)).await.unwrap();
    assert_eq!(answer.adapter, "local");
    assert_eq!(answer.source, "ocr", "{}", answer.text);
    let lower = answer.text.to_lowercase();
    assert!(lower.contains("notausgang"), "{}", answer.text);
    assert!(lower.contains("kein zutritt"), "{}", answer.text);
    assert!(
        answer.text.starts_with("Read off the photo with OCR"),
        "{}",
        answer.text
    );
    // The glossary explains what it recognised.
    assert!(answer.text.contains("emergency exit"), "{}", answer.text);
    assert!(answer.text.contains("no entry"), "{}", answer.text);
}

/// Issue 27: the copies of several photos are read in photo order, the
/// second sign's text after the first's; a damaged copy among them is left
/// out while the others read.
#[tokio::test]
async fn ocr_reads_every_photo_in_order() {
    let Some(brain) = ocr_brain("brain_local::ocr_reads_every_photo_in_order") else {
        return;
    };
    let request = BrainRequest {
        copies: vec![
            sign("sign.png"),
            CopyImage {
                bytes: b"not an image".to_vec(),
                content_type: "image/png".into(),
            },
            sign("sign2.png"),
        ],
        ..sign_request(None)
    };
    let answer = brain.read(request).await.unwrap();
    assert_eq!(answer.source, "ocr", "{}", answer.text);
    let lower = answer.text.to_lowercase();
    let first = lower.find("kein zutritt").expect("the first photo's text");
    let second = lower
        .find("bitte klingeln")
        .expect("the second photo's text");
    assert!(first < second, "photo order: {}", answer.text);
}

#[tokio::test]
async fn ocr_wins_over_typed_text_and_mentions_it() {
    let Some(brain) = ocr_brain("brain_local::ocr_wins_over_typed_text_and_mentions_it") else {
        return;
    };
    let answer = brain
        .read(sign_request(Some("emergency door")))
        .await
        .unwrap();
    assert_eq!(answer.source, "ocr");
    assert!(answer.text.to_lowercase().contains("notausgang"));
    assert!(answer.text.contains("You typed: \"emergency door\""));
}

#[tokio::test]
async fn ocr_runs_concurrently() {
    let Some(brain) = ocr_brain("brain_local::ocr_runs_concurrently") else {
        return;
    };
    let brain = std::sync::Arc::new(brain);
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let brain = brain.clone();
            tokio::spawn(async move { brain.read(sign_request(None)).await })
        })
        .collect();
    for call in calls {
        let answer = call.await.unwrap().unwrap();
        assert_eq!(answer.source, "ocr");
        assert!(answer.text.to_lowercase().contains("kein zutritt"));
    }
}

#[tokio::test]
async fn without_a_copy_it_reads_the_text() {
    let brain = LocalBrain::new(LocalConfig::default());
    let answer = brain
        .read(BrainRequest {
            moment_text: Some("Stationnement\n   interdit".into()),
            caption: Some("next to the bakery".into()),
            mode: "practical".into(),
            ..BrainRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (answer.adapter.as_str(), answer.source.as_str()),
        ("local", "text")
    );
    assert!(
        answer.text.contains("no photo was uploaded"),
        "{}",
        answer.text
    );
    assert!(answer
        .text
        .contains("The sign says: \"Stationnement interdit\""));
    assert!(answer.text.contains("no parking"));
    assert!(answer.text.contains("Your note: next to the bakery"));
}

#[tokio::test]
async fn a_missing_tesseract_falls_back_to_the_text() {
    let brain = LocalBrain::new(LocalConfig {
        tesseract_path: Some("/nonexistent/bin/tesseract".into()),
        ..LocalConfig::default()
    });
    let answer = brain
        .read(sign_request(Some("Ausfahrt freihalten")))
        .await
        .unwrap();
    assert_eq!(answer.source, "text");
    assert!(
        answer
            .text
            .contains("tesseract not found at /nonexistent/bin/tesseract"),
        "{}",
        answer.text
    );
    assert!(answer.text.contains("keep the exit clear"));
}

#[tokio::test]
async fn nothing_to_read_is_an_error() {
    let brain = LocalBrain::new(LocalConfig::default());
    let err = brain
        .read(BrainRequest {
            mode: "practical".into(),
            ..BrainRequest::default()
        })
        .await
        .unwrap_err();
    assert!(err.0.contains("nothing to read"), "{err}");

    // A photo that cannot be read and no text: still nothing to read.
    let brain = LocalBrain::new(LocalConfig {
        tesseract_path: Some("/nonexistent/bin/tesseract".into()),
        ..LocalConfig::default()
    });
    let err = brain.read(sign_request(None)).await.unwrap_err();
    assert!(err.0.contains("nothing to read"), "{err}");
    assert!(err.0.contains("tesseract not found"), "{err}");
}

#[tokio::test]
async fn recall_makes_a_practice_prompt() {
    let brain = LocalBrain::new(LocalConfig::default());
    let answer = brain
        .read(BrainRequest {
            moment_text: Some("Rauchen verboten\nSortie de secours\nВыход".into()),
            mode: "recall".into(),
            ..BrainRequest::default()
        })
        .await
        .unwrap();
    assert_eq!(answer.source, "text");
    assert!(
        answer.text.contains("Quick recall: 3 phrases."),
        "{}",
        answer.text
    );
    assert!(answer
        .text
        .contains("1. Rauchen verboten (answer: no smoking (German))"));
    assert!(answer
        .text
        .contains("2. Sortie de secours (answer: emergency exit (French))"));
    assert!(answer.text.contains("3. Выход (answer: exit (Russian))"));
}
