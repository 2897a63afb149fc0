//! The built-in embedder: hashed n-gram features (the "hashing trick"), offline and free.
//!
//! It is lexical. Two texts score high when they share words, word pairs or spellings
//! ("retry" and "retries" share most character trigrams); it does not know that "abort" and
//! "cancel" mean the same thing. Use [`super::OpenAiEmbedder`] with a real model when
//! paraphrases must match.
//!
//! How a text becomes a vector:
//! 1. Lowercase it and split it into words: maximal runs of Unicode alphanumeric characters.
//! 2. Features, each with a weight:
//!    - every word, weight 1.0;
//!    - every pair of adjacent words, weight 0.5: word order carries some meaning ("cache
//!      miss" vs "miss cache"), but less than the words themselves;
//!    - every character trigram of every word padded with `^` and `$` ("ab" gives "^ab" and
//!      "ab$"), weight 0.5: inflections and typos share most trigrams, so "retry" finds
//!      "retries" (cosine about 0.3), while a shared whole word, which brings all its trigrams
//!      along, still counts most.
//!
//!    Every word counts, including "the" and "to": unrelated sentences that share only such
//!    words score around 0.15, which is noise to rank below, not a match.
//! 3. Each feature, tagged with its kind so a word and a trigram with the same letters stay
//!    apart, is hashed with 64-bit FNV-1a followed by the MurmurHash3 finaliser (FNV-1a alone
//!    mixes its low bits poorly, and the low bits choose the slot). Slot = hash % dims; the
//!    top bit chooses the sign, so features sharing a slot add zero-mean noise to a dot
//!    product instead of inflating every score.
//! 4. The vector is L2-normalised. A text with no words gives the zero vector.
//!
//! The hash is written here, not taken from `std`, because stored vectors must be identical
//! across processes, platforms and Rust versions. The one outside input is Rust's Unicode
//! tables (lowercasing, "alphanumeric"), which change only for newly assigned characters.
//! Changing any of the above changes the vectors: bump the version in the model name.

use super::{BoxFuture, EmbedError, Embedder};

const WORD_WEIGHT: f32 = 1.0;
const WORD_PAIR_WEIGHT: f32 = 0.5;
const CHAR_TRIGRAM_WEIGHT: f32 = 0.5;

const DEFAULT_DIMS: usize = 512;
const MODEL_PREFIX: &str = "baton-hashed-ngrams-v1";

/// Hashed n-gram vectors; see the module docs of `embed::hashed` for the scheme.
/// Lexical only: it finds shared words and spellings, not paraphrases.
#[derive(Debug, Clone)]
pub struct HashedNgrams {
    dims: usize,
    model: String,
}

impl HashedNgrams {
    /// # Panics
    /// If `dims` is 0: there would be no slot to hash features into.
    pub fn new(dims: usize) -> Self {
        assert!(dims > 0, "HashedNgrams needs at least one dimension");
        Self {
            dims,
            model: format!("{MODEL_PREFIX}-{dims}"),
        }
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    /// The vector of one text, synchronously (the [`Embedder`] impl is this, per text).
    pub fn embed_text(&self, text: &str) -> Vec<f32> {
        let mut vector = vec![0.0f32; self.dims];
        let lowercase = text.to_lowercase();
        let words: Vec<&str> = lowercase
            .split(|c: char| !c.is_alphanumeric())
            .filter(|word| !word.is_empty())
            .collect();

        // One buffer reused for every feature keeps this allocation-free per feature.
        let mut feature = String::new();
        for word in &words {
            feature.clear();
            feature.push_str("w:");
            feature.push_str(word);
            self.add(&mut vector, &feature, WORD_WEIGHT);
        }
        for pair in words.windows(2) {
            feature.clear();
            feature.push_str("b:");
            feature.push_str(pair[0]);
            feature.push(' ');
            feature.push_str(pair[1]);
            self.add(&mut vector, &feature, WORD_PAIR_WEIGHT);
        }
        for word in &words {
            let padded: Vec<char> = std::iter::once('^')
                .chain(word.chars())
                .chain(std::iter::once('$'))
                .collect();
            for trigram in padded.windows(3) {
                feature.clear();
                feature.push_str("c:");
                feature.extend(trigram);
                self.add(&mut vector, &feature, CHAR_TRIGRAM_WEIGHT);
            }
        }

        normalise(&mut vector);
        vector
    }

    fn add(&self, vector: &mut [f32], feature: &str, weight: f32) {
        let hash = stable_hash(feature.as_bytes());
        // u64 -> usize after the modulo, so 32-bit targets pick the same slot as 64-bit ones.
        let slot = (hash % self.dims as u64) as usize;
        let sign = if hash >> 63 == 0 { 1.0 } else { -1.0 };
        vector[slot] += sign * weight;
    }
}

impl Default for HashedNgrams {
    fn default() -> Self {
        Self::new(DEFAULT_DIMS)
    }
}

impl Embedder for HashedNgrams {
    fn model(&self) -> &str {
        &self.model
    }

    fn embed<'a>(
        &'a self,
        texts: &'a [String],
    ) -> BoxFuture<'a, Result<Vec<Vec<f32>>, EmbedError>> {
        Box::pin(async move { Ok(texts.iter().map(|text| self.embed_text(text)).collect()) })
    }
}

fn normalise(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// 64-bit FNV-1a, then MurmurHash3's `fmix64` so that every output bit depends on every input
/// bit.
fn stable_hash(bytes: &[u8]) -> u64 {
    fmix64(fnv1a64(bytes))
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = FNV_OFFSET_BASIS;
    for &byte in bytes {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

fn fmix64(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::{fmix64, fnv1a64};

    #[test]
    fn fnv1a64_matches_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn fmix64_keeps_zero_and_spreads_one_bit() {
        assert_eq!(fmix64(0), 0);
        // One flipped input bit must flip about half the output bits (avalanche).
        let flipped_bits = (fmix64(1) ^ fmix64(3)).count_ones();
        assert!(
            (16..=48).contains(&flipped_bits),
            "{flipped_bits} bits flipped"
        );
    }
}
