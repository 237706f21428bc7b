//! A minimal slab: stable small integer keys, O(1) insert/remove, lowest
//! free key reused last-in-first-out (like a file descriptor table).

pub struct Slab<T> {
    entries: Vec<Option<T>>,
    free: Vec<usize>,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> Slab<T> {
    pub fn insert(&mut self, v: T) -> usize {
        self.len += 1;
        match self.free.pop() {
            Some(k) => {
                self.entries[k] = Some(v);
                k
            }
            None => {
                self.entries.push(Some(v));
                self.entries.len() - 1
            }
        }
    }

    /// Inserts at key `k` (a forked child inherits its parent's socket ids);
    /// false if `k` is taken.
    pub fn insert_at(&mut self, k: usize, v: T) -> bool {
        while self.entries.len() <= k {
            self.free.push(self.entries.len());
            self.entries.push(None);
        }
        if self.entries[k].is_some() {
            return false;
        }
        self.free.retain(|&f| f != k);
        self.entries[k] = Some(v);
        self.len += 1;
        true
    }

    pub fn remove(&mut self, k: usize) -> Option<T> {
        let v = self.entries.get_mut(k)?.take()?;
        self.free.push(k);
        self.len -= 1;
        Some(v)
    }

    pub fn get(&self, k: usize) -> Option<&T> {
        self.entries.get(k)?.as_ref()
    }

    pub fn get_mut(&mut self, k: usize) -> Option<&mut T> {
        self.entries.get_mut(k)?.as_mut()
    }

    /// One past the highest key ever handed out: every key is below it.
    pub fn key_bound(&self) -> usize {
        self.entries.len()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn keys(&self) -> Vec<usize> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.is_some())
            .map(|(k, _)| k)
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(k, e)| e.as_ref().map(|v| (k, v)))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut T)> {
        self.entries
            .iter_mut()
            .enumerate()
            .filter_map(|(k, e)| e.as_mut().map(|v| (k, v)))
    }
}

#[cfg(test)]
mod tests {
    use super::Slab;

    #[test]
    fn keys_are_reused_after_remove() {
        let mut s = Slab::default();
        let a = s.insert("a");
        let b = s.insert("b");
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None);
        assert_eq!(s.insert("c"), a);
        assert_eq!(s.get(b), Some(&"b"));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn insert_at_takes_exactly_that_key() {
        let mut s = Slab::default();
        assert!(s.insert_at(3, "d"));
        assert!(!s.insert_at(3, "x"));
        assert_eq!(s.get(3), Some(&"d"));
        assert_eq!(s.len(), 1);
        let mut keys = vec![s.insert("a"), s.insert("b"), s.insert("c"), s.insert("e")];
        keys.sort();
        assert_eq!(keys, vec![0, 1, 2, 4]);
    }
}
