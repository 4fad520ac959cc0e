// tracedash number formats for the pages' live redraws, the same rules as the server's templates
// (charts/money.py money_text; tests/test_money_format.py checks both on one
// table of cases): "$" first, thousands separators, two decimals from $1 up ($1,234.56), two
// significant digits below it ($0.0042, $0.00042), "-$1.50" for a negative amount, "–" for none;
// moneySigned (a difference) adds "+" to a positive amount: "+$0.0012".
(function (root) {
  "use strict";
  var MAX_DECIMALS = 8;
  function money(value) {
    if (value === null || value === undefined || value === "") return "–";
    var amount = Number(value);
    if (!isFinite(amount)) return "–";
    var sign = amount < 0 ? "-" : "";
    amount = Math.abs(amount);
    var decimals = 2;
    if (amount > 0 && amount < 1) {
      decimals = Math.min(MAX_DECIMALS, Math.max(2, 1 - Math.floor(Math.log10(amount))));
    }
    var text = amount.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
    if (decimals > 2) {  // $0.0050 reads $0.005; never fewer than two decimals
      text = text.replace(/0+$/, "");
      while (text.length < text.indexOf(".") + 3) text += "0";
    }
    if (Number(text.replace(/,/g, "")) === 0) sign = "";
    return sign + "$" + text;
  }
  // A difference of money: "+$0.0012" / "-$0.0012"; zero (after rounding) "$0.00", none "–"
  // (charts/money.py money_signed_text).
  function moneySigned(value) {
    var text = money(value);
    if (text.charAt(0) === "$" && Number(text.slice(1).replace(/,/g, "")) !== 0) return "+" + text;
    return text;
  }
  root.tracedashFormat = { money: money, moneySigned: moneySigned };
})(typeof window !== "undefined" ? window : globalThis);
